// A tiny canvas line plot (no dependencies): axes with ticks and titles, linear or log y,
// several series with a legend; image grids, an RGB image and bar charts.
//
//   import { linePlot } from "../common/plot.js";
//   linePlot(canvas, { title: "loss", xLabel: "step", yLabel: "loss", logY: true,
//                      series: [{ xs, ys, color, label }] });
//
// After drawing, canvas.dataset.filled holds the number of things drawn (finite points, images,
// bars, pixels: tests read it), linePlot's canvas.dataset.points the points and
// canvas.dataset.longest the most points of one series.

const FONT = "12px system-ui, sans-serif";
export const COLORS = { blue: "#2563eb", orange: "#ea580c", green: "#16a34a", gray: "#9ca3af",
                        red: "#dc2626", ink: "#111827", grid: "#e5e7eb", axis: "#6b7280" };

function niceStep(span, count) {
  const raw = span / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / mag;
  return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

function linearTicks(lo, hi, count = 5, integer = false) {
  if (!(hi > lo)) return [lo];
  const step = Math.max(integer ? 1 : 0, niceStep(hi - lo, count));
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    ticks.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  }
  return ticks;
}

function logTicks(lo, hi) {
  const decades = [], all = [];
  for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
    for (const m of [1, 2, 5]) {
      const v = m * 10 ** e;
      if (v < lo * 0.999 || v > hi * 1.001) continue;
      all.push(v);
      if (m === 1) decades.push(v);
    }
  }
  if (decades.length >= 3) return decades;
  if (all.length >= 3) return all;  // 1-2-5 ticks across less than two decades
  return linearTicks(lo, hi, 4).filter((v) => v > 0);  // a narrow range
}

function fmt(v) {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e4 || a < 1e-2) return v.toExponential(0).replace("e+", "e");
  return String(+v.toPrecision(3));
}

/** Centered moving average of `ys` over `window` points (default: 1/40 of the length, at
 *  least 5): a smooth trend for noisy losses, without the lag of an exponential average. */
export function smooth(ys, window) {
  const n = ys.length;
  const half = Math.floor(Math.max(5, window ?? Math.round(n / 40)) / 2);
  const sum = new Float64Array(n + 1), count = new Float64Array(n + 1);
  for (let i = 0; i < n; i++) {
    const ok = Number.isFinite(ys[i]);
    sum[i + 1] = sum[i] + (ok ? ys[i] : 0);
    count[i + 1] = count[i] + (ok ? 1 : 0);
  }
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    const lo = Math.max(0, i - half), hi = Math.min(n, i + half + 1);
    const c = count[hi] - count[lo];
    out[i] = c > 0 ? (sum[hi] - sum[lo]) / c : NaN;
  }
  return out;
}

const TITLE_FONT = "bold 13px system-ui, sans-serif";

/** `title` in lines that fit `width` (at most two; a longer title ends with "…"). */
function titleLines(ctx, title, width) {
  if (!title) return [];
  ctx.font = TITLE_FONT;
  const lines = [];
  let line = "";
  for (const word of title.split(" ")) {
    const next = line ? `${line} ${word}` : word;
    if (line && ctx.measureText(next).width > width) { lines.push(line); line = word; }
    else line = next;
  }
  lines.push(line);
  if (lines.length > 2 || ctx.measureText(lines.at(-1)).width > width) {
    let last = lines.slice(1).join(" ") || lines[0];
    while (last.length > 1 && ctx.measureText(`${last}…`).width > width) last = last.slice(0, -1);
    lines.splice(lines.length > 1 ? 1 : 0, lines.length, `${last}…`);
  }
  ctx.font = FONT;
  return lines;
}

/** A chart's title at the top left of `canvas`, wrapped to its width; where the drawing
 *  below it may start. The font is FONT again after it. */
function drawTitle(ctx, title, w) {
  const lines = titleLines(ctx, title, w - 12);
  ctx.fillStyle = COLORS.ink;
  ctx.textAlign = "left";
  ctx.textBaseline = "top";
  ctx.font = TITLE_FONT;
  lines.forEach((line, i) => ctx.fillText(line, 6, 6 + 16 * i));
  ctx.font = FONT;
  return lines.length ? 8 + 16 * lines.length : 6;
}

/** Size the canvas backing store to its CSS box times the device pixel ratio. */
function fit(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(1, Math.round(canvas.clientWidth || canvas.width));
  const h = Math.max(1, Math.round(canvas.clientHeight || canvas.height));
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return { ctx, w, h };
}

/**
 * Draw `series` ([{xs, ys, color, label, width, dots}]) into `canvas`.
 * Options: title, xLabel, yLabel (axis titles), logY, yMin/yMax/xMin/xMax (fixed ranges),
 * xInteger (x is a count, e.g. steps: ticks at whole numbers, a single x spans x..x+1),
 * yFormat (a tick label from a value), empty (text shown when there is nothing to draw).
 */
export function linePlot(canvas, { series = [], title = "", xLabel = "", yLabel = "",
                                   logY = false, xMin, xMax, yMin, yMax, xInteger = false,
                                   yFormat = fmt, empty = "" } = {}) {
  const { ctx, w, h } = fit(canvas);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, w, h);
  ctx.font = FONT;
  const pad = { left: yLabel ? 62 : 50, right: 12, top: drawTitle(ctx, title, w) + 2,
                bottom: xLabel ? 40 : 26 };
  const pw = w - pad.left - pad.right;
  const legend = legendLayout(ctx, series, pad.left, pad.top, pw);
  pad.top = legend.bottom;
  const ph = h - pad.top - pad.bottom;

  const ok = (x, y) => Number.isFinite(x) && Number.isFinite(y) && (!logY || y > 0);
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity, points = 0, longest = 0;
  for (const s of series) {
    const before = points;
    for (let i = 0; i < s.ys.length; i++) {
      const x = s.xs ? s.xs[i] : i, y = s.ys[i];
      if (!ok(x, y)) continue;
      points++;
      x0 = Math.min(x0, x); x1 = Math.max(x1, x);
      y0 = Math.min(y0, y); y1 = Math.max(y1, y);
    }
    longest = Math.max(longest, points - before);
  }
  canvas.dataset.points = canvas.dataset.filled = String(points);
  canvas.dataset.longest = String(longest);  // the most points of one series
  if (xMin !== undefined) x0 = xMin;
  if (xMax !== undefined) x1 = xMax;
  if (yMin !== undefined) y0 = yMin;
  if (yMax !== undefined) y1 = yMax;
  if (!points) {
    ctx.strokeStyle = COLORS.grid;
    ctx.strokeRect(pad.left + 0.5, pad.top + 0.5, pw, ph);
    ctx.fillStyle = COLORS.axis;
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    ctx.fillText(empty || "no data yet", pad.left + pw / 2, pad.top + ph / 2);
    return;
  }
  if (x1 <= x0) {
    if (xInteger) x1 = x0 + 1;
    else { x0 -= 0.5; x1 += 0.5; }
  }
  if (logY) {
    if (y1 <= y0) { y0 /= 2; y1 *= 2; }
    const ly0 = Math.log10(y0), ly1 = Math.log10(y1), m = (ly1 - ly0) * 0.05;
    if (yMin === undefined) y0 = 10 ** (ly0 - m);
    if (yMax === undefined) y1 = 10 ** (ly1 + m);
  } else {
    if (y1 <= y0) { y0 -= 0.5; y1 += 0.5; }
    const m = (y1 - y0) * 0.05;
    if (yMin === undefined) y0 -= m;
    if (yMax === undefined) y1 += m;
  }
  const px = (x) => pad.left + ((x - x0) / (x1 - x0)) * pw;
  const py = logY
    ? (y) => pad.top + (1 - (Math.log10(y) - Math.log10(y0)) / (Math.log10(y1) - Math.log10(y0))) * ph
    : (y) => pad.top + (1 - (y - y0) / (y1 - y0)) * ph;

  // grid and ticks
  ctx.lineWidth = 1;
  ctx.strokeStyle = COLORS.grid;
  ctx.fillStyle = COLORS.axis;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const t of logY ? logTicks(y0, y1) : linearTicks(y0, y1)) {
    const y = Math.round(py(t)) + 0.5;
    ctx.beginPath(); ctx.moveTo(pad.left, y); ctx.lineTo(pad.left + pw, y); ctx.stroke();
    ctx.fillText(yFormat(t), pad.left - 6, y);
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (const t of linearTicks(x0, x1, Math.max(2, Math.floor(pw / 80)), xInteger)) {
    const x = Math.round(px(t)) + 0.5;
    ctx.beginPath(); ctx.moveTo(x, pad.top); ctx.lineTo(x, pad.top + ph); ctx.stroke();
    ctx.fillText(fmt(t), x, pad.top + ph + 5);
  }
  ctx.strokeStyle = COLORS.axis;
  ctx.strokeRect(pad.left + 0.5, pad.top + 0.5, pw, ph);
  if (xLabel) ctx.fillText(xLabel, pad.left + pw / 2, pad.top + ph + 22);
  if (yLabel) {
    ctx.save();
    ctx.translate(12, pad.top + ph / 2);
    ctx.rotate(-Math.PI / 2);
    ctx.textBaseline = "middle";
    ctx.fillText(yLabel, 0, 0);
    ctx.restore();
  }

  // series, clipped to the plot area
  ctx.save();
  ctx.beginPath();
  ctx.rect(pad.left, pad.top, pw, ph);
  ctx.clip();
  for (const s of series) {
    ctx.strokeStyle = s.color ?? COLORS.blue;
    ctx.fillStyle = s.color ?? COLORS.blue;
    ctx.lineWidth = s.width ?? 1.5;
    ctx.lineJoin = "round";
    ctx.beginPath();
    let pen = false;
    for (let i = 0; i < s.ys.length; i++) {
      const x = s.xs ? s.xs[i] : i, y = s.ys[i];
      if (!ok(x, y)) { pen = false; continue; }
      if (s.dots) ctx.fillRect(px(x) - 1.5, py(y) - 1.5, 3, 3);
      if (pen) ctx.lineTo(px(x), py(y));
      else { ctx.moveTo(px(x), py(y)); pen = true; }
    }
    if (!s.dots) ctx.stroke();
  }
  ctx.restore();

  drawLegend(ctx, legend.items);
}

/** The legend of the labelled series: rows of items (a line of the series' colour and its
 *  label) from `left`, below `top`, wrapping at `width`; `bottom` is where the plot starts. */
function legendLayout(ctx, series, left, top, width) {
  const items = [];
  let x = left, y = top + 9;
  for (const s of series.filter((s) => s.label)) {
    const w = ctx.measureText(s.label).width + 34;
    if (x + w > left + width && x > left) { x = left; y += 18; }
    items.push({ x, y, label: s.label, color: s.color ?? COLORS.blue });
    x += w;
  }
  return { items, bottom: items.length ? y + 13 : top };
}

function drawLegend(ctx, items) {
  ctx.textAlign = "left";
  ctx.textBaseline = "middle";
  for (const { x, y, label, color } of items) {
    ctx.strokeStyle = color;
    ctx.lineWidth = 2.5;
    ctx.beginPath(); ctx.moveTo(x, y); ctx.lineTo(x + 16, y); ctx.stroke();
    ctx.fillStyle = COLORS.ink;
    ctx.fillText(label, x + 20, y);
  }
}

/** How much of `canvas` is drawn on: {pixels, nonBackground, colors} (white is background). */
export function inkStats(canvas) {
  const ctx = canvas.getContext("2d");
  const { data } = ctx.getImageData(0, 0, canvas.width, canvas.height);
  let ink = 0;
  const colors = new Set();
  for (let i = 0; i < data.length; i += 4) {
    if (data[i] < 250 || data[i + 1] < 250 || data[i + 2] < 250) {
      ink++;
      if (colors.size < 64) colors.add((data[i] >> 4) << 8 | (data[i + 1] >> 4) << 4 | (data[i + 2] >> 4));
    }
  }
  return { pixels: data.length / 4, nonBackground: ink, colors: colors.size };
}

/** The training-loss plot every demo shows: raw batch losses, and a smoothed trend once
 *  there are 20 of them; log y unless `logY` is false. */
export function lossPlot(canvas, ys, { title = "training loss (log scale)", logY = true,
                                       xLabel = "step", yLabel = "loss" } = {}) {
  const xs = Array.from(ys, (_, i) => i + 1);
  const many = ys.length >= 20;
  linePlot(canvas, {
    title, xLabel, yLabel, logY, xInteger: true, empty: "no steps yet",
    series: [{ xs, ys, color: many ? "#93c5fd" : COLORS.blue, width: many ? 1 : 2, label: "batch loss" },
             ...(many ? [{ xs, ys: smooth(ys), color: COLORS.blue, width: 2, label: "smoothed" }] : [])],
  });
}

/** A 1-d fit: the target curve (gray) and the model's (orange) over `fit` = {xs, target,
 *  pred, step} (null before the first evaluation). Options: title, target and model (legend
 *  labels), xLabel, yLabel, xMin/xMax/yMin/yMax. */
export function fitPlot(canvas, fit, { title = "fit", target = "target", model = "model",
                                       xLabel = "x", yLabel = "y", ...ranges } = {}) {
  linePlot(canvas, { title, xLabel, yLabel, ...ranges, empty: "waiting for the model",
    series: fit ? [{ xs: fit.xs, ys: fit.target, color: COLORS.gray, width: 3, label: target },
                   { xs: fit.xs, ys: fit.pred, color: COLORS.orange, width: 2,
                     label: `${model}, step ${fit.step}` }] : [] });
}

/**
 * A grid of grayscale images: `images` holds n·h·w values (0..1, or lo..hi), row-major.
 * Options: cols, title, labels (one string under each image), lo, hi, maxCell (largest
 * image side in CSS pixels), rows (how many rows to make room for while there are none yet),
 * empty (the text shown then). The images fill the canvas's width; the canvas's height is set
 * to what the rows need. canvas.dataset.images (and .filled) is the number drawn,
 * canvas.dataset.right the right edge of the drawn images (CSS pixels).
 */
export function imageGrid(canvas, images, { n, h = 28, w = 28, cols = 8, title = "", labels,
                                            lo = 0, hi = 1, maxCell = 72, rows: wanted = 1,
                                            empty = "no images yet" } = {}) {
  const count = n ?? Math.floor(images.length / (h * w));
  const width = canvas.clientWidth || canvas.width;
  const lines = titleLines(canvas.getContext("2d"), title, width - 12).length;
  const top = lines ? 8 + 16 * lines : 4, below = labels ? 16 : 0, gap = 4;
  const rows = count ? Math.ceil(count / cols) : wanted;
  const cell = Math.max(4, Math.min(maxCell, Math.floor((width - gap) / cols - gap)));
  const height = `${top + rows * (cell + below + gap) + gap}px`;
  if (canvas.style.height !== height) canvas.style.height = height;
  const { ctx, w: cw, h: ch } = fit(canvas);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, cw, ch);
  drawTitle(ctx, title, cw);
  canvas.dataset.images = canvas.dataset.filled = String(count);
  const left = Math.max(0, Math.floor((cw - gap - cols * (cell + gap)) / 2));  // centred
  canvas.dataset.right = String(left + Math.min(count, cols) * (cell + gap));  // drawn to
  if (!count) {
    ctx.fillStyle = COLORS.axis;
    ctx.font = FONT;
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    ctx.fillText(empty, cw / 2, (top + ch) / 2);
    return;
  }
  const tile = new OffscreenCanvas(w, h);
  const tctx = tile.getContext("2d");
  const img = tctx.createImageData(w, h);
  ctx.imageSmoothingEnabled = false;
  ctx.font = FONT;
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (let k = 0; k < count; k++) {
    for (let p = 0; p < h * w; p++) {
      const v = Math.round(255 * (1 - Math.min(1, Math.max(0, (images[k * h * w + p] - lo) / (hi - lo)))));
      img.data[4 * p] = img.data[4 * p + 1] = img.data[4 * p + 2] = v;
      img.data[4 * p + 3] = 255;
    }
    tctx.putImageData(img, 0, 0);
    const x = left + gap + (k % cols) * (cell + gap);
    const y = top + Math.floor(k / cols) * (cell + below + gap);
    ctx.drawImage(tile, x, y, cell, cell);
    ctx.strokeStyle = COLORS.grid;
    ctx.strokeRect(x + 0.5, y + 0.5, cell - 1, cell - 1);
    if (labels?.[k] !== undefined) {
      ctx.fillStyle = COLORS.ink;
      ctx.fillText(String(labels[k]), x + cell / 2, y + cell + 2);
    }
  }
}

/** An RGB image (`rgb`: h·w·3 values in 0..1) scaled to fit `canvas`, with a title. */
export function rgbImage(canvas, rgb, { h, w, title = "" } = {}) {
  const { ctx, w: cw, h: ch } = fit(canvas);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, cw, ch);
  const top = drawTitle(ctx, title, cw);
  canvas.dataset.filled = String(rgb ? h * w : 0);
  if (!rgb) return;
  const tile = new OffscreenCanvas(w, h);
  const tctx = tile.getContext("2d");
  const img = tctx.createImageData(w, h);
  for (let p = 0; p < h * w; p++) {
    for (let c = 0; c < 3; c++) img.data[4 * p + c] = Math.round(255 * Math.min(1, Math.max(0, rgb[3 * p + c])));
    img.data[4 * p + 3] = 255;
  }
  tctx.putImageData(img, 0, 0);
  const side = Math.min(cw - 8, ch - top - 4);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(tile, (cw - side) / 2, top, side, side);
}

/** Horizontal bars (`values` in 0..1) with `labels`; the largest in `highlight` colour. */
export function barChart(canvas, values, { labels = [], title = "", color = COLORS.blue,
                                           highlight = COLORS.orange } = {}) {
  const { ctx, w, h } = fit(canvas);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, w, h);
  ctx.font = FONT;
  const top = drawTitle(ctx, title, w);
  canvas.dataset.bars = canvas.dataset.filled = String(values?.length ?? 0);
  if (!values?.length) return;
  const best = values.indexOf(Math.max(...values));
  const rowH = (h - top - 4) / values.length;
  // the labels' column as wide as the widest label (class names), at most a third
  const widest = Math.max(12, ...values.map((_, i) => ctx.measureText(String(labels[i] ?? i)).width));
  const left = Math.min(Math.round(w / 3), Math.ceil(widest) + 16), right = 52;
  const bw = w - left - right;
  ctx.textBaseline = "middle";
  for (let i = 0; i < values.length; i++) {
    const y = top + i * rowH;
    ctx.fillStyle = COLORS.ink;
    ctx.textAlign = "right";
    ctx.fillText(String(labels[i] ?? i), left - 8, y + rowH / 2);
    ctx.fillStyle = "#f3f4f6";
    ctx.fillRect(left, y + 2, bw, rowH - 4);
    ctx.fillStyle = i === best ? highlight : color;
    ctx.fillRect(left, y + 2, Math.max(0, Math.min(1, values[i])) * bw, rowH - 4);
    ctx.fillStyle = COLORS.ink;
    ctx.textAlign = "left";
    ctx.fillText(`${(100 * values[i]).toFixed(1)}%`, left + bw + 6, y + rowH / 2);
  }
}
