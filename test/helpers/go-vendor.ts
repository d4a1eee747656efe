/**
 * Module-mode Go builds offline, from Debian's Go source packages (/usr/share/gocode/src:
 * golang-google-grpc-dev, golang-google-protobuf-dev …). `go mod tidy` would fetch the modules
 * from the Go module proxy; instead, `vendorDebianModules` fills the module's `vendor/` with links
 * to Debian's sources and writes the `vendor/modules.txt` and go.mod requirements that
 * `go build -mod=vendor` checks, so that the rest of the build (go.mod, the replace of a local
 * module, the import paths) is the one the caller's module has.
 */
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";

export const debianGoRoot = "/usr/share/gocode/src";

/** The Debian modules a grpc-go client links (those missing are left out). */
const debianModules = [
  "google.golang.org/grpc",
  "google.golang.org/protobuf",
  "google.golang.org/genproto",
  "github.com/golang/protobuf",
  "golang.org/x/net",
  "golang.org/x/sys",
  "golang.org/x/text",
];

/** The import paths of the packages under `dir` (directories with non-test .go files). */
function packagesOf(dir: string, importPath: string): string[] {
  const entries = readdirSync(dir, { withFileTypes: true });
  const own = entries.some((e) => e.isFile() && e.name.endsWith(".go") && !e.name.endsWith("_test.go"));
  const nested = entries
    .filter(
      (e) => (e.isDirectory() || e.isSymbolicLink()) && e.name !== "testdata" && !e.name.startsWith("."),
    )
    .filter((e) => statSync(join(dir, e.name)).isDirectory())
    .flatMap((e) => packagesOf(join(dir, e.name), `${importPath}/${e.name}`));
  return own ? [importPath, ...nested] : nested;
}

/**
 * Vendors Debian's modules, and the modules `moduleDir`'s go.mod replaces with a local directory
 * (`localModules`: module path → that directory, relative to moduleDir), into `moduleDir/vendor`.
 */
export function vendorDebianModules(moduleDir: string, localModules: Record<string, string>): void {
  const goVersion = execFileSync("go", ["env", "GOVERSION"], { encoding: "utf8" })
    .trim()
    .replace(/^go(\d+\.\d+).*/, "$1");
  const vendor = join(moduleDir, "vendor");
  const lines: string[] = [];
  const add = (module: string, source: string, header: string): void => {
    mkdirSync(dirname(join(vendor, module)), { recursive: true });
    symlinkSync(source, join(vendor, module));
    lines.push(header, `## explicit; go ${goVersion}`, ...packagesOf(source, module));
    execFileSync("go", ["mod", "edit", `-require=${module}@v0.0.0`], { cwd: moduleDir });
  };
  for (const module of debianModules) {
    const source = join(debianGoRoot, module);
    if (existsSync(source)) add(module, source, `# ${module} v0.0.0`);
  }
  for (const [module, dir] of Object.entries(localModules)) {
    add(module, resolve(moduleDir, dir), `# ${module} v0.0.0 => ${dir}`);
  }
  for (const [module, dir] of Object.entries(localModules)) lines.push(`# ${module} => ${dir}`);
  writeFileSync(join(vendor, "modules.txt"), `${lines.join("\n")}\n`);
}
