// A drawing pad for the MNIST demos: white strokes on a black square canvas, read back as an
// MNIST-like 28x28 image (the ink's bounding box scaled to 20 px and centred, as MNIST's digits
// are). It can show a 28x28 image (a held-out digit) until the user's first stroke replaces it.
//
//   import { DrawingPad } from "../common/pad.js";
//   const pad = new DrawingPad(canvas, { onDraw: () => predict(pad.pixels()) });
//   pad.show(values);   // 784 values in 0..1, shown until the first stroke
//   pad.clear();        // black; pad.inked is false until something is drawn or shown
//   pad.erase();        // the user's Clear: black, and show() no longer shows anything
//
// The canvas's dataset.filled is "1" while it holds ink (what the first-minute test reads).

export class DrawingPad {
  /** canvas: a square canvas (its width is the drawing's resolution); onDraw(): after each
   *  stroke; onClear(): after clear(); brush: the pen's radius in canvas pixels. */
  constructor(canvas, { onDraw, onClear, brush } = {}) {
    this.canvas = canvas;
    this.size = canvas.width;
    this.ctx = canvas.getContext("2d", { willReadFrequently: true });
    this.onDraw = onDraw;
    this.onClear = onClear;
    this.brush = brush ?? this.size / 25;
    this.inked = false;
    this.drawn = false;    // the user has drawn (a shown image no longer comes back)
    this.showing = false;  // the ink is a shown image, replaced by the first stroke
    let down = false;
    canvas.style.touchAction = "none";
    canvas.onpointerdown = (e) => { down = true; canvas.setPointerCapture(e.pointerId); this.stroke(e); };
    canvas.onpointermove = (e) => { if (down) this.stroke(e); };
    canvas.onpointerup = () => { down = false; };
    this.clear();
  }

  /** A black pad (the user's drawing, or the shown image, gone). */
  clear() {
    this.ctx.fillStyle = "#000";
    this.ctx.fillRect(0, 0, this.size, this.size);
    this.inked = this.showing = false;
    this.canvas.dataset.filled = "0";
    this.onClear?.();
  }

  /** The user's Clear: black, and a shown image no longer comes back. */
  erase() {
    this.drawn = true;
    this.clear();
  }

  /** Show a 28x28 image (784 values in 0..1), unless the user has drawn. */
  show(values) {
    if (this.drawn || !values) return;
    const small = new OffscreenCanvas(28, 28), sctx = small.getContext("2d");
    const img = sctx.createImageData(28, 28);
    for (let i = 0; i < 784; i++) {
      img.data[4 * i] = img.data[4 * i + 1] = img.data[4 * i + 2] = Math.round(255 * values[i]);
      img.data[4 * i + 3] = 255;
    }
    sctx.putImageData(img, 0, 0);
    this.ctx.drawImage(small, 0, 0, this.size, this.size);
    this.inked = this.showing = true;
    this.canvas.dataset.filled = "1";
  }

  stroke(e) {
    if (this.showing) this.clear();  // the first stroke replaces a shown image
    this.drawn = true;
    const r = this.canvas.getBoundingClientRect();
    const x = (e.clientX - r.left) * this.size / r.width, y = (e.clientY - r.top) * this.size / r.height;
    this.ctx.fillStyle = "#fff";
    this.ctx.beginPath();
    this.ctx.arc(x, y, this.brush, 0, 2 * Math.PI);
    this.ctx.fill();
    this.inked = true;
    this.canvas.dataset.filled = "1";
    this.onDraw?.();
  }

  /** The drawing as 784 values in 0..1 (three decimals), MNIST-like: its bounding box
   *  scaled to 20 px and centred in 28x28. All zeros when the pad is empty. */
  pixels() {
    const n = this.size, { data } = this.ctx.getImageData(0, 0, n, n);
    let x0 = n, y0 = n, x1 = -1, y1 = -1;
    for (let y = 0; y < n; y++) for (let x = 0; x < n; x++) {
      if (data[4 * (y * n + x)] > 20) {
        x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
      }
    }
    const out = new Array(784).fill(0);
    if (x1 < 0) return out;
    const side = Math.max(x1 - x0, y1 - y0) + 1, scale = 20 / side;
    const small = new OffscreenCanvas(28, 28);
    const sctx = small.getContext("2d", { willReadFrequently: true });
    sctx.fillStyle = "#000";
    sctx.fillRect(0, 0, 28, 28);
    const w = (x1 - x0 + 1) * scale, h = (y1 - y0 + 1) * scale;
    sctx.drawImage(this.canvas, x0, y0, x1 - x0 + 1, y1 - y0 + 1, (28 - w) / 2, (28 - h) / 2, w, h);
    const img = sctx.getImageData(0, 0, 28, 28).data;
    for (let i = 0; i < 784; i++) out[i] = Math.round(1000 * img[4 * i] / 255) / 1000;
    return out;
  }
}
