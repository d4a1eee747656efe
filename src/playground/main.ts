// The playground page: wires the form to the gateway (api.ts), draws the residual-norm heatmap
// (heatmap.ts) from tensors decoded in the browser (tensor.ts), and builds, applies and exports
// contrastive steering vectors (activations.ts). Each section's `data-phase` attribute says what
// it is doing (idle, streaming, done, error), for people and for the browser tests alike.
import {
  contrastiveVector,
  residualAt,
  residualNorms,
  steeringVectorJson,
  vectorNorm,
} from "./activations.js";
import {
  ApiRefusal,
  type CompletionRequest,
  describeRefusal,
  GatewayClient,
  type ModelInfo,
  type SteeringVectorJson,
} from "./api.js";
import { cellAt, drawHeatmap, drawVector, type HeatmapGeometry, tokenLabel } from "./heatmap.js";
import { type DecodedTensor, decodeTensor } from "./tensor.js";

/** sessionStorage key of the API key: kept for this tab only. */
const KEY_STORAGE = "acs-playground-api-key";

function el<T extends HTMLElement>(id: string): T {
  const found = document.getElementById(id);
  if (found === null) throw new Error(`#${id} is missing from the page`);
  return found as T;
}

const ui = {
  keyStatus: el<HTMLSpanElement>("key-status"),
  forgetKey: el<HTMLButtonElement>("forget-key"),
  keyPanel: el<HTMLElement>("key-panel"),
  keyForm: el<HTMLFormElement>("key-form"),
  keyInput: el<HTMLInputElement>("key-input"),
  error: el<HTMLDivElement>("error"),
  completionSection: el<HTMLElement>("completion-section"),
  model: el<HTMLSelectElement>("model"),
  maxTokens: el<HTMLInputElement>("max-tokens"),
  temperature: el<HTMLInputElement>("temperature"),
  seed: el<HTMLInputElement>("seed"),
  prompt: el<HTMLTextAreaElement>("prompt"),
  layerBoxes: el<HTMLDivElement>("layer-boxes"),
  layersAll: el<HTMLButtonElement>("layers-all"),
  layersNone: el<HTMLButtonElement>("layers-none"),
  generate: el<HTMLButtonElement>("generate"),
  stop: el<HTMLButtonElement>("stop"),
  completionStatus: el<HTMLSpanElement>("completion-status"),
  completion: el<HTMLPreElement>("completion"),
  activationsSection: el<HTMLElement>("activations-section"),
  perLayer: el<HTMLInputElement>("per-layer"),
  heatmap: el<HTMLCanvasElement>("heatmap"),
  tokenView: el<HTMLDivElement>("token-view"),
  tokenVector: el<HTMLCanvasElement>("token-vector"),
  steeringSection: el<HTMLElement>("steering-section"),
  steerLayer: el<HTMLSelectElement>("steer-layer"),
  steerScale: el<HTMLInputElement>("steer-scale"),
  steerNormMatch: el<HTMLInputElement>("steer-norm-match"),
  steerPositive: el<HTMLTextAreaElement>("steer-positive"),
  steerNegative: el<HTMLTextAreaElement>("steer-negative"),
  steerBuild: el<HTMLButtonElement>("steer-build"),
  steerCompare: el<HTMLButtonElement>("steer-compare"),
  steerStatus: el<HTMLSpanElement>("steer-status"),
  unsteered: el<HTMLPreElement>("unsteered"),
  steered: el<HTMLPreElement>("steered"),
  vectorJson: el<HTMLTextAreaElement>("vector-json"),
  steerExport: el<HTMLButtonElement>("steer-export"),
};

const client = new GatewayClient("", sessionStorage.getItem(KEY_STORAGE) ?? undefined);
let models: ModelInfo[] = [];
let running: AbortController | undefined;

/** The last heatmap: what hovering reads. */
let shown:
  | {
      stream: DecodedTensor;
      norms: Float32Array;
      layers: number[];
      tokens: string[];
      geometry: HeatmapGeometry;
    }
  | undefined;

/** The last steering vector built (hidden numbers) and its layer. */
let vector: { values: Float64Array; layer: number } | undefined;

function showError(err: unknown): void {
  ui.error.textContent = describeRefusal(err);
  ui.error.hidden = false;
}

function clearError(): void {
  ui.error.textContent = "";
  ui.error.hidden = true;
}

function showKeyState(): void {
  ui.keyStatus.textContent = client.key ? "key: set for this tab" : "";
  ui.forgetKey.hidden = !client.key;
}

function currentModel(): ModelInfo | undefined {
  return models.find((m) => m.id === ui.model.value);
}

function chosenLayers(): number[] {
  return [...ui.layerBoxes.querySelectorAll<HTMLInputElement>("input[type=checkbox]")]
    .filter((box) => box.checked)
    .map((box) => Number(box.value));
}

/** Layer checkboxes and the steering layer list for the chosen model. */
function showLayers(): void {
  const model = currentModel();
  ui.layerBoxes.replaceChildren();
  ui.steerLayer.replaceChildren();
  if (model === undefined) return;
  const n = model.num_hidden_layers;
  for (let layer = 0; layer < n; layer++) {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.value = String(layer);
    // All layers of a small model; every fourth and the last of a large one (the capture cap).
    box.checked = n <= 8 || layer % 4 === 0 || layer === n - 1;
    label.append(box, String(layer));
    ui.layerBoxes.append(label);
    const option = document.createElement("option");
    option.value = String(layer);
    option.textContent = String(layer);
    ui.steerLayer.append(option);
  }
  ui.steerLayer.value = String(Math.floor(n / 2));
}

async function loadModels(): Promise<void> {
  try {
    models = await client.models();
  } catch (err) {
    if (err instanceof ApiRefusal && err.status === 401) {
      ui.keyPanel.hidden = false;
      if (client.key) showError(err);
      ui.keyInput.focus();
      return;
    }
    showError(err);
    return;
  }
  clearError();
  ui.keyPanel.hidden = true;
  const previous = ui.model.value;
  ui.model.replaceChildren(
    ...models.map((m) => {
      const option = document.createElement("option");
      option.value = m.id;
      option.textContent = `${m.id} (${m.num_hidden_layers} layers, hidden ${m.hidden_size})`;
      return option;
    }),
  );
  if (models.some((m) => m.id === previous)) ui.model.value = previous;
  showLayers();
}

/** The sampling fields of the form (model, prompt, max_tokens, temperature, seed). */
function baseRequest(): CompletionRequest {
  const request: CompletionRequest = {
    model: ui.model.value,
    prompt: ui.prompt.value,
    max_tokens: Number(ui.maxTokens.value),
    temperature: Number(ui.temperature.value),
  };
  if (ui.seed.value.trim() !== "") request.seed = Number(ui.seed.value);
  return request;
}

function setPhase(section: HTMLElement, phase: "idle" | "streaming" | "done" | "error"): void {
  section.dataset.phase = phase;
}

/** Streams `request` into `target` chunk by chunk; returns the chunks' tokens and the activations. */
async function streamInto(
  request: CompletionRequest,
  target: HTMLElement,
  signal: AbortSignal,
): Promise<{ tokens: string[]; activations: unknown }> {
  const tokens: string[] = [];
  let activations: unknown;
  const text = document.createTextNode("");
  target.replaceChildren(text);
  for await (const chunk of client.stream(request, signal)) {
    for (const choice of chunk.choices) {
      text.appendData(choice.text);
      if (choice.logprobs) tokens.push(...choice.logprobs.tokens);
    }
    if (chunk.activations) activations = chunk.activations.residual_stream;
  }
  return { tokens, activations };
}

function renderHeatmap(): void {
  if (shown === undefined) return;
  shown.geometry = drawHeatmap(ui.heatmap, {
    norms: shown.norms,
    layerIndices: shown.layers,
    positions: shown.stream.shape[1] ?? 0,
    tokens: shown.tokens,
    perLayer: ui.perLayer.checked,
  });
  ui.heatmap.dataset.rows = String(shown.geometry.rows);
  ui.heatmap.dataset.columns = String(shown.geometry.columns);
  ui.heatmap.dataset.left = String(shown.geometry.left);
  ui.heatmap.dataset.top = String(shown.geometry.top);
  ui.heatmap.dataset.cellWidth = String(shown.geometry.cellWidth);
  ui.heatmap.dataset.cellHeight = String(shown.geometry.cellHeight);
}

async function generate(): Promise<void> {
  clearError();
  running?.abort();
  const controller = new AbortController();
  running = controller;
  const layers = chosenLayers();
  const request: CompletionRequest = { ...baseRequest(), echo: true, logprobs: 0 };
  if (layers.length > 0) request.output_residual_stream = layers;
  setPhase(ui.completionSection, "streaming");
  setPhase(ui.activationsSection, layers.length > 0 ? "streaming" : "idle");
  ui.generate.disabled = true;
  ui.stop.disabled = false;
  ui.completionStatus.textContent = "streaming…";
  try {
    const { tokens, activations } = await streamInto(request, ui.completion, controller.signal);
    ui.completionStatus.textContent = `done: ${tokens.length} tokens (prompt and completion)`;
    setPhase(ui.completionSection, "done");
    if (activations !== undefined) {
      const stream = decodeTensor(activations);
      const { norms } = residualNorms(stream);
      shown = {
        stream,
        norms,
        layers,
        tokens,
        geometry: { left: 0, top: 0, cellWidth: 1, cellHeight: 1, rows: 0, columns: 0 },
      };
      renderHeatmap();
      setPhase(ui.activationsSection, "done");
    }
  } catch (err) {
    if (controller.signal.aborted) {
      ui.completionStatus.textContent = "stopped";
      setPhase(ui.completionSection, "done");
    } else {
      ui.completionStatus.textContent = "refused";
      showError(err);
      setPhase(ui.completionSection, "error");
    }
    setPhase(ui.activationsSection, "idle");
  } finally {
    ui.generate.disabled = false;
    ui.stop.disabled = true;
  }
}

function hover(event: MouseEvent): void {
  if (shown === undefined) return;
  const rect = ui.heatmap.getBoundingClientRect();
  const cell = cellAt(shown.geometry, event.clientX - rect.left, event.clientY - rect.top);
  if (cell === undefined) return;
  const columns = shown.geometry.columns;
  const norm = shown.norms[cell.row * columns + cell.position]!;
  const perLayer = shown.layers
    .map((layer, row) => `L${layer} ${shown!.norms[row * columns + cell.position]!.toFixed(2)}`)
    .join(" · ");
  ui.tokenView.textContent =
    `position ${cell.position} · token ${JSON.stringify(shown.tokens[cell.position] ?? "")} ` +
    `(${tokenLabel(shown.tokens[cell.position])}) · layer ${shown.layers[cell.row]} · ‖x‖ = ${norm.toFixed(3)}\n` +
    `this token at every captured layer: ${perLayer}`;
  drawVector(ui.tokenVector, residualAt(shown.stream, cell.row, cell.position));
}

function promptLines(area: HTMLTextAreaElement): string[] {
  return area.value
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line !== "");
}

function currentVectorJson(): SteeringVectorJson | undefined {
  if (vector === undefined) return undefined;
  return steeringVectorJson(
    vector.values,
    vector.layer,
    Number(ui.steerScale.value),
    ui.steerNormMatch.checked,
  );
}

function showVectorJson(): void {
  const json = currentVectorJson();
  ui.vectorJson.value = json === undefined ? "" : JSON.stringify({ apply_steering_vectors: [json] });
}

async function buildVector(): Promise<void> {
  clearError();
  const layer = Number(ui.steerLayer.value);
  const positive = promptLines(ui.steerPositive);
  const negative = promptLines(ui.steerNegative);
  if (positive.length === 0 || negative.length === 0) {
    showError(new Error("Write at least one prompt in each list."));
    return;
  }
  setPhase(ui.steeringSection, "streaming");
  ui.steerStatus.textContent = `capturing layer ${layer} for ${positive.length + negative.length} prompts…`;
  ui.steerBuild.disabled = true;
  // One request per prompt: prompt tokens + 1 − 1 positions each, at the one layer.
  const capture = async (prompt: string): Promise<DecodedTensor> => {
    const response = await client.complete({
      model: ui.model.value,
      prompt,
      max_tokens: 1,
      temperature: 0,
      output_residual_stream: [layer],
    });
    if (!response.activations) throw new Error("the response has no activations");
    return decodeTensor(response.activations.residual_stream);
  };
  try {
    const [pos, neg] = await Promise.all([
      Promise.all(positive.map(capture)),
      Promise.all(negative.map(capture)),
    ]);
    const values = contrastiveVector(pos, neg);
    vector = { values, layer };
    showVectorJson();
    ui.steerStatus.textContent = `vector at layer ${layer}: ‖v‖ = ${vectorNorm(values).toFixed(3)} (${values.length} numbers)`;
    ui.steerCompare.disabled = false;
    ui.steerExport.disabled = false;
    setPhase(ui.steeringSection, "idle");
  } catch (err) {
    ui.steerStatus.textContent = "refused";
    showError(err);
    setPhase(ui.steeringSection, "error");
  } finally {
    ui.steerBuild.disabled = false;
  }
}

async function compare(): Promise<void> {
  const json = currentVectorJson();
  if (json === undefined) return;
  clearError();
  const request = baseRequest();
  // Both sides sample with one seed, so only the steering differs.
  if (request.seed === undefined && request.temperature > 0)
    request.seed = Math.floor(Math.random() * 2 ** 31);
  const controller = new AbortController();
  setPhase(ui.steeringSection, "streaming");
  ui.steerCompare.disabled = true;
  ui.steerStatus.textContent = "streaming both…";
  try {
    await Promise.all([
      streamInto(request, ui.unsteered, controller.signal),
      streamInto({ ...request, apply_steering_vectors: [json] }, ui.steered, controller.signal),
    ]);
    ui.steerStatus.textContent =
      ui.unsteered.textContent === ui.steered.textContent ? "done: the same text" : "done: the texts differ";
    setPhase(ui.steeringSection, "done");
  } catch (err) {
    controller.abort();
    ui.steerStatus.textContent = "refused";
    showError(err);
    setPhase(ui.steeringSection, "error");
  } finally {
    ui.steerCompare.disabled = false;
  }
}

function exportVector(): void {
  if (vector === undefined) return;
  const blob = new Blob([ui.vectorJson.value], { type: "application/json" });
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = `steering-vector-layer-${vector.layer}.json`;
  link.click();
  URL.revokeObjectURL(link.href);
}

ui.keyForm.addEventListener("submit", (event) => {
  event.preventDefault();
  const key = ui.keyInput.value.trim();
  if (key === "") return;
  sessionStorage.setItem(KEY_STORAGE, key);
  client.key = key;
  ui.keyInput.value = "";
  showKeyState();
  void loadModels();
});
ui.forgetKey.addEventListener("click", () => {
  sessionStorage.removeItem(KEY_STORAGE);
  client.key = undefined;
  showKeyState();
  void loadModels();
});
ui.model.addEventListener("change", showLayers);
ui.layersAll.addEventListener("click", () => {
  for (const box of ui.layerBoxes.querySelectorAll<HTMLInputElement>("input")) box.checked = true;
});
ui.layersNone.addEventListener("click", () => {
  for (const box of ui.layerBoxes.querySelectorAll<HTMLInputElement>("input")) box.checked = false;
});
ui.generate.addEventListener("click", () => void generate());
ui.stop.addEventListener("click", () => running?.abort());
ui.perLayer.addEventListener("change", renderHeatmap);
ui.heatmap.addEventListener("mousemove", hover);
ui.steerBuild.addEventListener("click", () => void buildVector());
ui.steerCompare.addEventListener("click", () => void compare());
ui.steerExport.addEventListener("click", exportVector);
ui.steerScale.addEventListener("input", showVectorJson);
ui.steerNormMatch.addEventListener("change", showVectorJson);

showKeyState();
void loadModels();
