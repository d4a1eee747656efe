/**
 * `npm run engine -- --preset NAME --port N [--host H] [--served-model-name S] [--max-model-len L]
 *   [--scheduling-policy fcfs|priority] [--exit-with-stdin]`
 * Starts the reference engine alone. Reads ENGINE_PRESET / ENGINE_PORT / ENGINE_HOST as fallbacks.
 */
import { PRESET_NAMES, type PresetName, startEngine } from "./index.js";

function arg(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  if (i >= 0) return process.argv[i + 1];
  const eq = process.argv.find((a) => a.startsWith(`--${name}=`));
  return eq?.slice(name.length + 3);
}

const presetName = arg("preset") ?? process.env.ENGINE_PRESET ?? "llama-8b";
if (!(PRESET_NAMES as readonly string[]).includes(presetName)) {
  console.error(`unknown preset ${presetName}; known: ${PRESET_NAMES.join(", ")}`);
  process.exit(2);
}
const port = Number(arg("port") ?? process.env.ENGINE_PORT ?? 8000);
const host = arg("host") ?? process.env.ENGINE_HOST ?? "127.0.0.1";
const served = arg("served-model-name");
const maxLen = arg("max-model-len");
const policy = arg("scheduling-policy");
if (policy !== undefined && policy !== "fcfs" && policy !== "priority") {
  console.error(`--scheduling-policy must be fcfs or priority, got ${policy}`);
  process.exit(2);
}
// --exit-with-stdin: the parent reads our stdout. Once it is gone, a write there fails (EPIPE):
// the engine stops as it does when stdin ends, rather than dying of the error with a stack trace.
const withParent = process.argv.includes("--exit-with-stdin");
if (withParent)
  process.stdout.on("error", (err: NodeJS.ErrnoException) => {
    if (err.code !== "EPIPE") console.error(`engine: writing to stdout failed: ${err.message}`);
    process.exit(err.code === "EPIPE" ? 0 : 1);
  });
const engine = await startEngine({
  preset: presetName as PresetName,
  port,
  host,
  ...(served ? { servedModelName: served } : {}),
  ...(maxLen ? { maxModelLen: Number(maxLen) } : {}),
  ...(policy ? { schedulingPolicy: policy } : {}),
});
console.log(
  `engine ${presetName} serving ${engine.model.id} at ${engine.url} (max_model_len ${engine.model.maxModelLen})`,
);
const stop = (): void => {
  void engine.close().then(() => process.exit(0));
};
process.on("SIGINT", stop);
process.on("SIGTERM", stop);
// --exit-with-stdin: a parent that starts the engine (the gateway's npm start) keeps our stdin
// open; when the parent dies, even by SIGKILL, stdin ends and the engine stops with it.
if (withParent) {
  process.stdin.on("end", stop);
  process.stdin.on("error", stop);
  process.stdin.resume();
}
