// The residual-norm heatmap: one canvas, layers as rows, positions as columns, the tokens on
// the x axis (rotated), the layer indices on the y axis, and a colour bar. cellAt() maps a mouse
// position back to (layer row, position) for the per-token view.

/** What the heatmap shows. */
export interface HeatmapData {
  /** (layers × positions) row-major L2 norms. */
  norms: Float32Array;
  /** The captured layer indices, ascending (one row each). */
  layerIndices: number[];
  positions: number;
  /** Token strings of positions 0…positions−1 (shorter arrays leave labels blank). */
  tokens: string[];
  /** Colour each layer by its own range instead of one range for all. */
  perLayer: boolean;
}

/** Where the cells are on the canvas, in CSS pixels. */
export interface HeatmapGeometry {
  left: number;
  top: number;
  cellWidth: number;
  cellHeight: number;
  rows: number;
  columns: number;
}

/** The background colour of the canvas (cells never take it). */
export const BACKGROUND = "#ffffff";

// Viridis, 9 stops.
const STOPS: ReadonlyArray<readonly [number, number, number]> = [
  [68, 1, 84],
  [71, 44, 122],
  [59, 81, 139],
  [44, 113, 142],
  [33, 144, 141],
  [39, 173, 129],
  [92, 200, 99],
  [170, 220, 50],
  [253, 231, 37],
];

/** Viridis colour of t in [0, 1] as `rgb(r, g, b)`. */
export function colourOf(t: number): string {
  const x = Math.min(1, Math.max(0, Number.isFinite(t) ? t : 0)) * (STOPS.length - 1);
  const i = Math.min(STOPS.length - 2, Math.floor(x));
  const f = x - i;
  const a = STOPS[i]!;
  const b = STOPS[i + 1]!;
  const c = (k: 0 | 1 | 2) => Math.round(a[k] + (b[k] - a[k]) * f);
  return `rgb(${c(0)}, ${c(1)}, ${c(2)})`;
}

/** A token as a short visible label: whitespace shown, long tokens cut. */
export function tokenLabel(token: string | undefined): string {
  if (token === undefined) return "";
  const shown = token.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥");
  return shown.length > 12 ? `${shown.slice(0, 11)}…` : shown;
}

function range(values: Float32Array, from: number, to: number): [number, number] {
  let lo = Number.POSITIVE_INFINITY;
  let hi = Number.NEGATIVE_INFINITY;
  for (let i = from; i < to; i++) {
    const v = values[i]!;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return [lo, hi];
}

/** Draws the heatmap on `canvas` (resized to fit) and returns where the cells are. */
export function drawHeatmap(canvas: HTMLCanvasElement, data: HeatmapData): HeatmapGeometry {
  const rows = data.layerIndices.length;
  const columns = data.positions;
  const cellWidth = Math.max(10, Math.min(36, Math.floor(900 / Math.max(1, columns))));
  const cellHeight = Math.max(8, Math.min(28, Math.floor(420 / Math.max(1, rows))));
  const left = 56;
  const top = 12;
  const axis = 90;
  const width = left + columns * cellWidth + 70;
  const height = top + rows * cellHeight + axis;
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  if (ctx === null) throw new Error("no 2D canvas context");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.fillStyle = BACKGROUND;
  ctx.fillRect(0, 0, width, height);

  const [globalLo, globalHi] = range(data.norms, 0, data.norms.length);
  for (let r = 0; r < rows; r++) {
    const [lo, hi] = data.perLayer ? range(data.norms, r * columns, (r + 1) * columns) : [globalLo, globalHi];
    for (let p = 0; p < columns; p++) {
      const v = data.norms[r * columns + p]!;
      ctx.fillStyle = colourOf(hi > lo ? (v - lo) / (hi - lo) : 0.5);
      ctx.fillRect(left + p * cellWidth, top + r * cellHeight, cellWidth, cellHeight);
    }
  }

  ctx.fillStyle = "#222";
  ctx.font = "11px monospace";
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (let r = 0; r < rows; r++) {
    ctx.fillText(`L${data.layerIndices[r]}`, left - 6, top + r * cellHeight + cellHeight / 2);
  }
  for (let p = 0; p < columns; p++) {
    ctx.save();
    ctx.translate(left + p * cellWidth + cellWidth / 2, top + rows * cellHeight + 6);
    ctx.rotate(-Math.PI / 2);
    ctx.fillText(tokenLabel(data.tokens[p]), 0, 0);
    ctx.restore();
  }

  // Colour bar with the range it stands for.
  const barX = left + columns * cellWidth + 14;
  const barH = rows * cellHeight;
  for (let y = 0; y < barH; y++) {
    ctx.fillStyle = colourOf(1 - y / Math.max(1, barH - 1));
    ctx.fillRect(barX, top + y, 12, 1);
  }
  ctx.fillStyle = "#222";
  ctx.textAlign = "left";
  ctx.font = "10px monospace";
  ctx.fillText(data.perLayer ? "max" : globalHi.toPrecision(3), barX + 15, top + 5);
  ctx.fillText(data.perLayer ? "min" : globalLo.toPrecision(3), barX + 15, top + barH - 5);
  return { left, top, cellWidth, cellHeight, rows, columns };
}

/** The (row, position) under CSS pixel (x, y) of the canvas, or undefined outside the cells. */
export function cellAt(
  g: HeatmapGeometry,
  x: number,
  y: number,
): { row: number; position: number } | undefined {
  const position = Math.floor((x - g.left) / g.cellWidth);
  const row = Math.floor((y - g.top) / g.cellHeight);
  if (position < 0 || position >= g.columns || row < 0 || row >= g.rows) return undefined;
  return { row, position };
}

/** Draws `values` as bars (one per hidden coordinate) on a small canvas: the per-token view. */
export function drawVector(canvas: HTMLCanvasElement, values: ArrayLike<number>): void {
  const width = 360;
  const height = 80;
  const ratio = window.devicePixelRatio || 1;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  if (ctx === null) return;
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.fillStyle = BACKGROUND;
  ctx.fillRect(0, 0, width, height);
  let max = 0;
  for (let j = 0; j < values.length; j++) max = Math.max(max, Math.abs(values[j]!));
  const step = width / Math.max(1, values.length);
  ctx.fillStyle = "#3b518b";
  for (let j = 0; j < values.length; j++) {
    const h = max > 0 ? (values[j]! / max) * (height / 2 - 2) : 0;
    ctx.fillRect(j * step, height / 2 - Math.max(h, 0), Math.max(1, step), Math.abs(h));
  }
  ctx.fillStyle = "#999";
  ctx.fillRect(0, height / 2, width, 1);
}
