/**
 * Rebuilds the third-party protos in proto-vendor/ (the BSR, where buf would normally fetch them,
 * is out of reach here): buf/validate/validate.proto from the file descriptor embedded in
 * @bufbuild/protovalidate, google/rpc/status.proto (google.rpc.Status, the message of gRPC's
 * `grpc-status-details-bin` trailer; generated for the Python client by `npm run
 * generate:clients`) from the descriptor embedded in @connectrpc/connect, and
 * grpc/health/v1/health.proto from the grpc-health-check package, and gRPC server reflection
 * (grpc/reflection/v1/reflection.proto and its predecessor v1alpha, which older clients still ask
 * for) from the @grpc/reflection package.
 *
 * Usage: `tsx proto-vendor/vendor-protos.ts` writes the file; `--check` exits 1 when the committed
 * file differs from what the installed package would produce (CI runs it to catch drift).
 * The printer covers exactly what validate.proto and status.proto use (proto2 and proto3
 * messages, oneofs, enums, extension and reserved ranges, top-level extensions, the
 * `(predefined).cel` field option, the file options they set) and throws on anything else, so a
 * new construct upstream fails loudly instead of being dropped.
 */
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { getExtension, hasExtension, isFieldSet } from "@bufbuild/protobuf";
import {
  type DescriptorProto,
  type EnumDescriptorProto,
  type FieldDescriptorProto,
  FieldDescriptorProto_Label,
  FieldDescriptorProto_Type,
  FieldDescriptorProtoSchema,
} from "@bufbuild/protobuf/wkt";
import {
  file_buf_validate_validate,
  predefined,
} from "@bufbuild/protovalidate/gen/buf/validate/validate_pb.js";
// Not in the package's exports; --check in CI fails loudly if an upgrade moves it.
import { file_status } from "../node_modules/@connectrpc/connect/dist/esm/protocol-grpc/gen/status_pb.js";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");

/** Vendored files and where their text comes from. */
const vendored: Array<{ target: string; render: () => string }> = [
  { target: "proto-vendor/buf/validate/validate.proto", render: () => renderValidateProto() },
  { target: "proto-vendor/google/rpc/status.proto", render: () => renderStatusProto() },
  {
    // gRPC's health protocol, as shipped by the grpc-health-check package (canonical path).
    target: "proto-vendor/grpc/health/v1/health.proto",
    render: () =>
      readFileSync(join(root, "node_modules/grpc-health-check/proto/health/v1/health.proto"), "utf8"),
  },
  // gRPC server reflection, as shipped by the @grpc/reflection package (canonical paths).
  ...(["v1", "v1alpha"] as const).map((version) => ({
    target: `proto-vendor/grpc/reflection/${version}/reflection.proto`,
    render: () =>
      readFileSync(
        join(root, `node_modules/@grpc/reflection/build/proto/grpc/reflection/${version}/reflection.proto`),
        "utf8",
      ),
  })),
];

function quote(s: string): string {
  let out = '"';
  for (const ch of s) {
    const c = ch.codePointAt(0) ?? 0;
    if (ch === "\\") out += "\\\\";
    else if (ch === '"') out += '\\"';
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (c < 0x20 || c === 0x7f) out += `\\${c.toString(8).padStart(3, "0")}`;
    else out += ch;
  }
  return `${out}"`;
}

const scalarNames: Partial<Record<FieldDescriptorProto_Type, string>> = {
  [FieldDescriptorProto_Type.DOUBLE]: "double",
  [FieldDescriptorProto_Type.FLOAT]: "float",
  [FieldDescriptorProto_Type.INT64]: "int64",
  [FieldDescriptorProto_Type.UINT64]: "uint64",
  [FieldDescriptorProto_Type.INT32]: "int32",
  [FieldDescriptorProto_Type.FIXED64]: "fixed64",
  [FieldDescriptorProto_Type.FIXED32]: "fixed32",
  [FieldDescriptorProto_Type.BOOL]: "bool",
  [FieldDescriptorProto_Type.STRING]: "string",
  [FieldDescriptorProto_Type.BYTES]: "bytes",
  [FieldDescriptorProto_Type.UINT32]: "uint32",
  [FieldDescriptorProto_Type.SFIXED32]: "sfixed32",
  [FieldDescriptorProto_Type.SFIXED64]: "sfixed64",
  [FieldDescriptorProto_Type.SINT32]: "sint32",
  [FieldDescriptorProto_Type.SINT64]: "sint64",
};

function fieldType(f: FieldDescriptorProto): string {
  if (f.type === FieldDescriptorProto_Type.MESSAGE || f.type === FieldDescriptorProto_Type.ENUM) {
    return f.typeName; // fully qualified with a leading dot: valid .proto syntax
  }
  const name = scalarNames[f.type];
  if (name === undefined) throw new Error(`unsupported field type ${f.type} on ${f.name}`);
  return name;
}

function fieldOptions(f: FieldDescriptorProto): string {
  const parts: string[] = [];
  if (isFieldSet(f, FieldDescriptorProtoSchema.field.defaultValue)) {
    parts.push(
      `default = ${f.type === FieldDescriptorProto_Type.STRING ? quote(f.defaultValue) : f.defaultValue}`,
    );
  }
  const o = f.options;
  if (o !== undefined) {
    const known = new Set(["$typeName", "$unknown", "uninterpretedOption", "editionDefaults", "targets"]);
    for (const [k, v] of Object.entries(o)) {
      if (known.has(k) || v === undefined || (Array.isArray(v) && v.length === 0)) continue;
      throw new Error(`unsupported field option ${k} on ${f.name}`);
    }
    for (const u of o.$unknown ?? []) {
      if (u.no !== predefined.number) throw new Error(`unsupported extension ${u.no} on ${f.name}`);
    }
    if (hasExtension(o, predefined)) {
      for (const rule of getExtension(o, predefined).cel) {
        const body = [`id: ${quote(rule.id)}`];
        if (rule.message !== "") body.push(`message: ${quote(rule.message)}`);
        body.push(`expression: ${quote(rule.expression)}`);
        parts.push(`(predefined).cel = {\n      ${body.join("\n      ")}\n    }`);
      }
    }
  }
  return parts.length === 0 ? "" : ` [\n    ${parts.join(",\n    ")}\n  ]`;
}

function indent(text: string, by: string): string {
  return text
    .split("\n")
    .map((l) => (l === "" ? l : by + l))
    .join("\n");
}

/** Whether the file being printed is proto3 (singular fields then have no label). */
let proto3 = false;

function printField(f: FieldDescriptorProto, inOneof: boolean): string {
  if (f.proto3Optional) throw new Error(`proto3 optional on ${f.name}`);
  const label = inOneof
    ? ""
    : f.label === FieldDescriptorProto_Label.REPEATED
      ? "repeated "
      : f.label === FieldDescriptorProto_Label.REQUIRED
        ? "required "
        : proto3
          ? ""
          : "optional ";
  return `${label}${fieldType(f)} ${f.name} = ${f.number}${fieldOptions(f)};`;
}

function printEnum(e: EnumDescriptorProto): string {
  const lines = e.value.map((v) => `${v.name} = ${v.number};`);
  // EnumReservedRange.end is inclusive, unlike DescriptorProto.ReservedRange.end.
  for (const r of e.reservedRange)
    lines.push(`reserved ${r.start === r.end ? r.start : `${r.start} to ${r.end}`};`);
  for (const n of e.reservedName) lines.push(`reserved ${quote(n)};`);
  return `enum ${e.name} {\n${indent(lines.join("\n"), "  ")}\n}`;
}

function printMessage(m: DescriptorProto): string {
  if (m.options !== undefined && (m.options.$unknown?.length ?? 0) > 0)
    throw new Error(`message options on ${m.name}`);
  const lines: string[] = [];
  let openOneof = -1;
  for (const f of m.field) {
    const idx = isFieldSet(f, FieldDescriptorProtoSchema.field.oneofIndex) ? f.oneofIndex : -1;
    if (idx !== openOneof) {
      if (openOneof >= 0) lines.push("}");
      if (idx >= 0) {
        const decl = m.oneofDecl[idx];
        if (decl === undefined) throw new Error(`oneof ${idx} missing in ${m.name}`);
        lines.push(`oneof ${decl.name} {`);
      }
      openOneof = idx;
    }
    lines.push(openOneof >= 0 ? indent(printField(f, true), "  ") : printField(f, false));
  }
  if (openOneof >= 0) lines.push("}");
  for (const n of m.nestedType) lines.push(printMessage(n));
  for (const e of m.enumType) lines.push(printEnum(e));
  for (const r of m.extensionRange)
    lines.push(`extensions ${r.start} to ${r.end === 536870912 ? "max" : r.end - 1};`);
  for (const r of m.reservedRange)
    lines.push(`reserved ${r.start === r.end - 1 ? r.start : `${r.start} to ${r.end - 1}`};`);
  for (const n of m.reservedName) lines.push(`reserved ${quote(n)};`);
  if (m.extension.length > 0) throw new Error(`nested extensions in ${m.name}`);
  return `message ${m.name} {\n${indent(lines.join("\n"), "  ")}\n}`;
}

/** File options the vendored files set, in the order they are printed. */
const fileOptionNames = [
  ["javaPackage", "java_package"],
  ["javaOuterClassname", "java_outer_classname"],
  ["javaMultipleFiles", "java_multiple_files"],
  ["goPackage", "go_package"],
  ["objcClassPrefix", "objc_class_prefix"],
] as const;

/** Prints a file descriptor back as .proto text, after `header` (comment lines). */
function renderProtoFile(f: typeof file_status.proto, header: string[]): string {
  const syntax = f.syntax === "" ? "proto2" : f.syntax;
  if (syntax !== "proto2" && syntax !== "proto3") throw new Error(`unsupported syntax ${f.syntax}`);
  proto3 = syntax === "proto3";
  const o = f.options;
  if (o !== undefined) {
    const known = new Set([
      "$typeName",
      "$unknown",
      "uninterpretedOption",
      ...fileOptionNames.map(([k]) => k),
    ]);
    for (const [k, v] of Object.entries(o)) {
      if (!known.has(k) && v !== undefined && !(Array.isArray(v) && v.length === 0)) {
        throw new Error(`unsupported file option ${k} in ${f.name}`);
      }
    }
  }
  const out: string[] = [
    ...header,
    `syntax = "${syntax}";`,
    "",
    `package ${f.package};`,
    "",
    ...f.dependency.map((d) => `import ${quote(d)};`),
    "",
  ];
  for (const [key, name] of fileOptionNames) {
    const v = o?.[key];
    // An empty string is an unset option as protobuf-es reads some embedded descriptors.
    if (v !== undefined && v !== "") out.push(`option ${name} = ${typeof v === "string" ? quote(v) : v};`);
  }
  out.push("");
  const byExtendee = new Map<string, FieldDescriptorProto[]>();
  for (const x of f.extension) byExtendee.set(x.extendee, [...(byExtendee.get(x.extendee) ?? []), x]);
  for (const [extendee, fields] of byExtendee) {
    out.push(`extend ${extendee} {\n${fields.map((x) => `  ${printField(x, false)}`).join("\n")}\n}`, "");
  }
  for (const m of f.messageType) out.push(printMessage(m), "");
  for (const e of f.enumType) out.push(printEnum(e), "");
  return `${out.join("\n").trimEnd()}\n`;
}

export function renderValidateProto(): string {
  return renderProtoFile(file_buf_validate_validate.proto, [
    "// Generated by proto-vendor/vendor-protos.ts from the descriptor embedded in @bufbuild/protovalidate.",
    "// Do not edit: run `npm run vendor-protos`. Licensed Apache-2.0 by Buf Technologies, Inc.",
  ]);
}

/** google.rpc.Status as @connectrpc/connect embeds it (its file is named status.proto there). */
export function renderStatusProto(): string {
  const f = file_status.proto;
  if (f.package !== "google.rpc") throw new Error(`unexpected package ${f.package} in ${f.name}`);
  return renderProtoFile(f, [
    "// Generated by proto-vendor/vendor-protos.ts from the descriptor embedded in @connectrpc/connect.",
    "// Do not edit: run `npm run vendor-protos`. Licensed Apache-2.0 by Google LLC.",
  ]);
}

let stale = false;
for (const { target, render } of vendored) {
  const path = join(root, target);
  const text = render();
  if (process.argv.includes("--check")) {
    let current = "";
    try {
      current = readFileSync(path, "utf8");
    } catch {}
    if (current !== text) {
      console.error(`${target} is out of date: run npm run vendor-protos`);
      stale = true;
    }
  } else {
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, text);
    console.log(`wrote ${target}`);
  }
}
if (stale) process.exit(1);
