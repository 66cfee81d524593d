// The PyScript worker demo's two plots, drawn on the page's thread from the worker's numbers.
const INK = "#111827", GRID = "#e5e7eb", AXIS = "#6b7280";
const BLUE = "#2563eb", ORANGE = "#ea580c", GRAY = "#9ca3af";

function frame(canvas, title) {
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#ffffff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.font = "12px system-ui, sans-serif";
  ctx.fillStyle = INK;
  ctx.fillText(title, 52, 15);
  return ctx;
}

// series: [{xs, ys, color, width}], y mapped through fy (log10 for the loss)
function lines(canvas, ctx, series, [x0, x1], [y0, y1], fy, ticks) {
  const w = canvas.width, h = canvas.height, left = 52, right = 12, top = 24, bottom = 28;
  const px = (x) => left + (x - x0) / (x1 - x0 || 1) * (w - left - right);
  const py = (y) => h - bottom - (fy(y) - y0) / (y1 - y0 || 1) * (h - top - bottom);
  ctx.strokeStyle = GRID; ctx.fillStyle = AXIS; ctx.lineWidth = 1;
  for (const t of ticks) {
    ctx.beginPath(); ctx.moveTo(left, py(t)); ctx.lineTo(w - right, py(t)); ctx.stroke();
    ctx.fillText(String(+t.toPrecision(3)), 4, py(t) + 4);
  }
  for (const { xs, ys, color, width } of series) {
    ctx.strokeStyle = color; ctx.lineWidth = width; ctx.beginPath();
    ys.forEach((y, i) => (i ? ctx.lineTo(px(xs[i]), py(y)) : ctx.moveTo(px(xs[i]), py(y))));
    ctx.stroke();
  }
  canvas.dataset.points = String(series.reduce((n, s) => n + s.ys.length, 0));
}

export function drawLoss(canvas, losses) {
  const ctx = frame(canvas, "training loss (log scale)");
  const ys = losses.filter((v) => v > 0);
  if (!ys.length) { canvas.dataset.points = "0"; return; }
  const lo = Math.floor(Math.log10(Math.min(...ys))), hi = Math.ceil(Math.log10(Math.max(...ys)));
  const ticks = [];
  for (let e = lo; e <= hi; e++) ticks.push(10 ** e);
  lines(canvas, ctx, [{ xs: ys.map((_, i) => i + 1), ys, color: BLUE, width: 1.5 }],
        [1, Math.max(2, ys.length)], [lo, hi === lo ? lo + 1 : hi], Math.log10, ticks);
}

export function drawFit(canvas, xs, pred) {
  const ctx = frame(canvas, "sin(x) and the trained model");
  const grid = Array.from({ length: 200 }, (_, i) => -Math.PI + 2 * Math.PI * i / 199);
  const series = [{ xs: grid, ys: grid.map(Math.sin), color: GRAY, width: 3 }];
  if (pred) series.push({ xs, ys: pred, color: ORANGE, width: 2 });
  lines(canvas, ctx, series, [-Math.PI, Math.PI], [-1.35, 1.35], (v) => v, [-1, -0.5, 0, 0.5, 1]);
}
