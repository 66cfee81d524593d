// The page of the character models (makemore, pokeformer): what their pages share, as
// char_lm.py is what their scripts share. `charDemo(name, samples)` is the Demo
// description: held-out loss against the unigram baseline, and the names sampled at the
// latest evaluation (`samples`: the card's title).

import { el } from "./shell.js";

const list = (ev) => ev.samples.map((n) => el("li", {}, n || "(empty)"));

export function charDemo(name, samples) {
  return {
    name,
    defaults: { steps: 1500, seed: 1, every: 100, val: 512, samples: 12 },
    headless: { steps: 20, every: 10, samples: 8 },
    python: ["char_lm"],
    files: ["main.py", "model.py", "../common/char_lm.py"],
    stats: [{ id: "val", label: "held-out", value: (ev) => ev.val_loss.toFixed(4) },
            { id: "uni", label: "unigram baseline", value: (ev) => ev.unigram.toFixed(4) }],
    cards: ["loss",
            { chart: "val", title: "held-out loss vs the unigram baseline",
              yLabel: "nats / character",
              series: [{ key: "val_loss", label: "held out", color: "orange" },
                       { key: "unigram", label: "unigram", color: "gray", dots: false }] },
            { id: "names", html: `<b>${samples}</b> <span id="samples-step">(after the first ` +
                                 `evaluation)</span><ol id="samples"></ol>` }],
    onEval: (ev) => {
      document.getElementById("samples-step").textContent = `(step ${ev.step})`;
      document.getElementById("samples").replaceChildren(...list(ev));
    },
    onReset: () => document.getElementById("samples").replaceChildren(),
  };
}
