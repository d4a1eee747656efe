// The playground page (GET /playground) in a real browser — Debian's chromium driven by
// playwright-core — against the real gateway and the reference engine (tiny preset): the
// completion streams, the heatmap is drawn from tensors the page decodes itself, a steering
// vector changes the completion and its exported JSON is what the API applies, a refusal shows
// the envelope's message, and with keys on the page asks for a key kept for the tab only.
// Screenshots of each state go to test-results/screenshots/playground/ (printed at the end).
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { launchChromium, skipBrowserTests } from "../helpers/browser.js";
import { buildPlayground } from "../helpers/build-playground.js";
import { jsDecoder, type TensorDict } from "../helpers/decode-tensor.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

const SCREENSHOTS = resolve("test-results/screenshots/playground");
const shots: string[] = [];

async function shoot(page: Page, name: string): Promise<void> {
  const path = join(SCREENSHOTS, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  shots.push(path);
}

/** A fresh context (its own sessionStorage) and page, recording every URL the page asks for. */
async function openPage(
  browser: Browser,
  stack: Stack,
): Promise<{ context: BrowserContext; page: Page; urls: string[] }> {
  const context = await browser.newContext({ viewport: { width: 1280, height: 1000 }, deviceScaleFactor: 1 });
  const page = await context.newPage();
  // No per-action time limits: a condition that never holds is caught by the test's hang guard.
  page.setDefaultTimeout(0);
  const urls: string[] = [];
  page.on("request", (request) => urls.push(request.url()));
  await page.goto(`${stack.url}/playground`);
  return { context, page, urls };
}

// Code that runs in the page is text (page.evaluate) or a function typed against this small view
// of the page's globals (waitForFunction: the page's CSP forbids evaluating text there): this
// file is type-checked without the DOM library.

/** The little of the page's DOM the predicates read. */
interface PageGlobals {
  document: {
    getElementById(id: string): {
      dataset: Record<string, string | undefined>;
      textContent: string | null;
      disabled: boolean;
      options: { length: number };
    } | null;
  };
}

/** Waits until a section's data-phase is `phase`. */
async function phaseIs(page: Page, section: string, phase: string): Promise<void> {
  await page.waitForFunction(
    ([id, want]) =>
      (globalThis as unknown as PageGlobals).document.getElementById(id)?.dataset.phase === want,
    [section, phase] as const,
    { timeout: 0 },
  );
}

async function modelsLoaded(page: Page): Promise<void> {
  await page.waitForFunction(
    () => ((globalThis as unknown as PageGlobals).document.getElementById("model")?.options.length ?? 0) > 0,
    null,
    { timeout: 0 },
  );
}

/** What the tests read of a completion or an error body. */
interface CompletionJson {
  choices: Array<{ text: string; logprobs: { tokens: string[] } }>;
  usage: { prompt_tokens: number; completion_tokens: number };
  activations: { residual_stream: TensorDict };
  error: { message: string; code: string };
}

async function postJson(
  stack: Stack,
  body: unknown,
  key?: string,
): Promise<{ status: number; json: CompletionJson }> {
  const response = await fetch(`${stack.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(key ? { authorization: `Bearer ${key}` } : {}) },
    body: JSON.stringify(body),
  });
  return { status: response.status, json: (await response.json()) as CompletionJson };
}

function l2(values: ArrayLike<number>): number {
  let sum = 0;
  for (let i = 0; i < values.length; i++) sum += values[i]! * values[i]!;
  return Math.sqrt(sum);
}

afterAll(() => {
  if (shots.length > 0) process.stdout.write(`\nplayground screenshots:\n  ${shots.join("\n  ")}\n`);
});

describe.skipIf(skipBrowserTests())("playground page in chromium", () => {
  let dir: string;
  let stack: Stack;
  let browser: Browser;

  beforeAll(async () => {
    dir = await buildPlayground();
    await mkdir(SCREENSHOTS, { recursive: true });
    stack = await startStack({ playgroundDir: dir });
    browser = await launchChromium();
  });

  afterAll(async () => {
    await browser?.close();
    await stack?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  const PROMPT = "Once upon a time";
  const MAX_TOKENS = 24;

  it("streams a completion into the page over several updates, then draws the heatmap from the activations", async () => {
    const { context, page, urls } = await openPage(browser, stack);
    await modelsLoaded(page);
    await page.selectOption("#model", stack.alias);
    await page.fill("#prompt", PROMPT);
    await page.fill("#max-tokens", String(MAX_TOKENS));
    await page.fill("#temperature", "0");
    await page.click("#layers-all");
    // Every state the text passes through, as the page renders it.
    await page.evaluate(`{
      const target = document.getElementById("completion");
      window.seen = [];
      new MutationObserver(() => window.seen.push(target.textContent)).observe(target, {
        childList: true,
        characterData: true,
        subtree: true,
      });
    }`);
    await page.click("#generate");
    await phaseIs(page, "completion-section", "done");
    await shoot(page, "1-streamed");

    // The same request without a stream: the text the page ends with.
    const reference = await postJson(stack, {
      model: stack.alias,
      prompt: PROMPT,
      max_tokens: MAX_TOKENS,
      temperature: 0,
      echo: true,
      logprobs: 0,
      output_residual_stream: [0, 1, 2, 3],
    });
    expect(reference.status).toBe(200);
    const fullText: string = reference.json.choices[0]!.text;
    const seen = ((await page.evaluate("window.seen")) as string[]).filter((s) => s !== "");
    const distinct = [...new Set(seen)];
    expect(distinct.at(-1)).toBe(fullText);
    // It grew: several states, each a prefix of the next.
    expect(distinct.length).toBeGreaterThanOrEqual(4);
    for (let i = 1; i < distinct.length; i++) expect(distinct[i]!.startsWith(distinct[i - 1]!)).toBe(true);

    // The heatmap: 4 layers × (prompt + generated − 1) positions, every cell painted, not all alike.
    await phaseIs(page, "activations-section", "done");
    const usage = reference.json.usage;
    const positions = usage.prompt_tokens + usage.completion_tokens - 1;
    const geometry = (await page.evaluate(`(() => {
      const canvas = document.getElementById("heatmap");
      const d = canvas.dataset;
      const g = {
        rows: Number(d.rows),
        columns: Number(d.columns),
        left: Number(d.left),
        top: Number(d.top),
        cellWidth: Number(d.cellWidth),
        cellHeight: Number(d.cellHeight),
      };
      const ratio = canvas.width / canvas.getBoundingClientRect().width;
      const ctx = canvas.getContext("2d");
      const centres = [];
      for (let r = 0; r < g.rows; r++) {
        for (let p = 0; p < g.columns; p++) {
          const x = Math.floor((g.left + (p + 0.5) * g.cellWidth) * ratio);
          const y = Math.floor((g.top + (r + 0.5) * g.cellHeight) * ratio);
          centres.push(Array.from(ctx.getImageData(x, y, 1, 1).data).join(","));
        }
      }
      return { ...g, centres };
    })()`)) as {
      rows: number;
      columns: number;
      left: number;
      top: number;
      cellWidth: number;
      cellHeight: number;
      centres: string[];
    };
    expect(geometry.rows).toBe(4);
    expect(geometry.columns).toBe(positions);
    expect(geometry.centres.filter((c) => c === "255,255,255,255")).toEqual([]);
    expect(new Set(geometry.centres).size).toBeGreaterThan(4);

    // The colours follow the norms (global range): the largest norm is viridis's top colour, the
    // smallest its bottom one, in the cells where an independent decoder of the same capture puts them.
    const [stream] = jsDecoder.decode([reference.json.activations.residual_stream]);
    const hidden = stream!.shape[2]!;
    const norms = Array.from({ length: 4 * positions }, (_, i) =>
      l2(stream!.values.subarray(i * hidden, (i + 1) * hidden)),
    );
    const argmax = norms.indexOf(Math.max(...norms));
    const argmin = norms.indexOf(Math.min(...norms));
    expect(geometry.centres[argmax]).toBe("253,231,37,255");
    expect(geometry.centres[argmin]).toBe("68,1,84,255");

    // Hover: the per-token view shows the token and the norm the page decoded (bf16 + zstd in the
    // browser), checked against the independent decoder.
    const box = (await page.locator("#heatmap").boundingBox())!;
    const row = 2;
    const position = 3;
    await page.mouse.move(
      box.x + geometry.left + (position + 0.5) * geometry.cellWidth,
      box.y + geometry.top + (row + 0.5) * geometry.cellHeight,
    );
    const start = (row * positions + position) * hidden;
    const norm = l2(stream!.values.subarray(start, start + hidden));
    const token = reference.json.choices[0]!.logprobs.tokens[position]!;
    const want = `position ${position} · token ${JSON.stringify(token)}`;
    await page.waitForFunction(
      (text) =>
        (globalThis as unknown as PageGlobals).document
          .getElementById("token-view")
          ?.textContent?.includes(text) === true,
      want,
      { timeout: 0 },
    );
    const view = await page.textContent("#token-view");
    expect(view).toContain(`layer ${row} · ‖x‖ = ${norm.toFixed(3)}`);
    await shoot(page, "2-heatmap-hover");

    // Everything the page loaded came from the gateway: no CDN, no other origin.
    expect(urls.filter((u) => !u.startsWith(`${stack.url}/`))).toEqual([]);
    await context.close();
  });

  it("builds a contrastive steering vector that changes the completion; its exported JSON is what the API applies", async () => {
    const { context, page } = await openPage(browser, stack);
    await modelsLoaded(page);
    await page.selectOption("#model", stack.alias);
    await page.fill("#prompt", PROMPT);
    await page.fill("#max-tokens", String(MAX_TOKENS));
    await page.fill("#temperature", "0");
    const layer = 2;
    const positive = ["I love this. It is wonderful.", "What a happy, joyful day."];
    const negative = ["I hate this. It is terrible.", "What a sad, miserable day."];
    await page.selectOption("#steer-layer", String(layer));
    await page.fill("#steer-scale", "4");
    await page.fill("#steer-positive", positive.join("\n"));
    await page.fill("#steer-negative", negative.join("\n"));
    await page.click("#steer-build");
    await page.waitForFunction(
      () =>
        (globalThis as unknown as PageGlobals).document.getElementById("steer-compare")?.disabled === false,
      null,
      { timeout: 0 },
    );
    await page.click("#steer-compare");
    await phaseIs(page, "steering-section", "done");
    await shoot(page, "3-steered-vs-unsteered");

    const unsteered = await page.textContent("#unsteered");
    const steered = await page.textContent("#steered");
    expect(unsteered).not.toBe("");
    expect(steered).not.toBe(unsteered);

    // The exported JSON: mean(positive) − mean(negative) of the captures at the layer…
    const exported = JSON.parse(await page.inputValue("#vector-json"));
    const [vector] = exported.apply_steering_vectors;
    expect(vector.layer_indices).toEqual([layer]);
    expect(vector.scale).toBe(4);
    expect(vector.norm_match).toBe(false);
    const meanOf = async (prompts: string[]): Promise<number[]> => {
      const sums: number[] = [];
      for (const prompt of prompts) {
        const r = await postJson(stack, {
          model: stack.alias,
          prompt,
          max_tokens: 1,
          temperature: 0,
          output_residual_stream: [layer],
        });
        const [t] = jsDecoder.decode([r.json.activations.residual_stream]);
        const [, count, width] = t!.shape as [number, number, number];
        for (let j = 0; j < width; j++) {
          let s = 0;
          for (let p = 0; p < count; p++) s += t!.values[p * width + j]!;
          sums[j] = (sums[j] ?? 0) + s / count / prompts.length;
        }
      }
      return sums;
    };
    const [pos, neg] = [await meanOf(positive), await meanOf(negative)];
    const expected = pos.map((v, j) => v - neg[j]!);
    expect(vector.activations).toHaveLength(1);
    expect(vector.activations[0]).toHaveLength(expected.length);
    for (let j = 0; j < expected.length; j++) {
      expect(Math.abs(vector.activations[0][j] - expected[j]!)).toBeLessThan(
        1e-9 * Math.max(1, Math.abs(expected[j]!)),
      );
    }
    // …and the API applies it as the page's steered side shows.
    const body = { model: stack.alias, prompt: PROMPT, max_tokens: MAX_TOKENS, temperature: 0 };
    const plain = await postJson(stack, body);
    const withVector = await postJson(stack, { ...body, ...exported });
    expect(plain.json.choices[0]!.text).toBe(unsteered);
    expect(withVector.status).toBe(200);
    expect(withVector.json.choices[0]!.text).toBe(steered);
    await context.close();
  });

  it("shows the envelope's message of a refusal", async () => {
    const { context, page } = await openPage(browser, stack);
    await modelsLoaded(page);
    await page.fill("#max-tokens", "100000");
    await page.click("#layers-none");
    await page.click("#generate");
    await phaseIs(page, "completion-section", "error");
    await shoot(page, "4-refusal");
    const direct = await postJson(stack, {
      model: await page.inputValue("#model"),
      prompt: await page.inputValue("#prompt"),
      max_tokens: 100000,
      temperature: 0,
      stream: true,
    });
    expect(direct.status).toBe(400);
    const shown = await page.textContent("#error");
    expect(shown).toContain(direct.json.error.message);
    expect(shown).toContain(direct.json.error.code);
    expect(shown).toMatch(/request req_[0-9a-f]{32}/);
    await context.close();
  });
});

describe.skipIf(skipBrowserTests())("playground page with keys on", () => {
  let dir: string;
  let dbDir: string;
  let stack: Stack;
  let browser: Browser;
  let key: string;

  beforeAll(async () => {
    dir = await buildPlayground();
    dbDir = await mkdtemp(join(tmpdir(), "acs-playground-db-"));
    await mkdir(SCREENSHOTS, { recursive: true });
    stack = await startStack({ playgroundDir: dir, dbPath: join(dbDir, "keys.db") });
    ({ key } = await stack.ledger!.createKey({ budgetTokens: 100_000 }));
    browser = await launchChromium();
  });

  afterAll(async () => {
    await browser?.close();
    await stack?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
    if (dbDir) await rm(dbDir, { recursive: true, force: true });
  });

  it("asks for a key, refuses a wrong one with the envelope's message, keeps a good one for the tab only", async () => {
    const { context, page } = await openPage(browser, stack);
    await page.waitForSelector("#key-panel:not([hidden])", { timeout: 0 });
    await shoot(page, "5-key-prompt");
    expect(await page.locator("#model option").count()).toBe(0);

    await page.fill("#key-input", "acs_wrong");
    await page.click("#key-save");
    await page.waitForSelector("#error:not([hidden])", { timeout: 0 });
    const wrong = await fetch(`${stack.url}/v1/models`, { headers: { authorization: "Bearer acs_wrong" } });
    expect(wrong.status).toBe(401);
    expect(await page.textContent("#error")).toContain(
      ((await wrong.json()) as CompletionJson).error.message,
    );
    expect(await page.isVisible("#key-panel")).toBe(true);

    await page.fill("#key-input", key);
    await page.click("#key-save");
    await modelsLoaded(page);
    expect(await page.isHidden("#key-panel")).toBe(true);
    expect(await page.evaluate("Object.values(sessionStorage)")).toEqual([key]);
    expect(await page.evaluate("Object.keys(localStorage)")).toEqual([]);
    await page.fill("#max-tokens", "8");
    await page.click("#layers-none");
    await page.click("#generate");
    await phaseIs(page, "completion-section", "done");
    await shoot(page, "6-key-accepted");

    // A reload keeps it (same tab); another tab's context does not have it.
    await page.reload();
    await modelsLoaded(page);
    expect(await page.isHidden("#key-panel")).toBe(true);
    const other = await openPage(browser, stack);
    await other.page.waitForSelector("#key-panel:not([hidden])", { timeout: 0 });
    await other.context.close();
    await context.close();
  });
});
