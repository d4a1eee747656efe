// The integer a JSON string holds (`priority: "2"` on REST; Connect JSON's integer fields read
// their strings the same way: src/surfaces/rpc/strict-json-text.ts).
import type { ApiError } from "../errors/index.js";
import { invalidType } from "./decode-refusals.js";

/**
 * What a string holds, read by one scan: `-?digits` is an integer (its sign and its digits without
 * leading zeros); `-?digits(.digits)?([eE][+-]?digits)?` is some other decimal numeral.
 */
function classifyNumeral(
  text: string,
): { kind: "integer"; negative: boolean; digits: string } | { kind: "decimal" | "none" } {
  const n = text.length;
  let i = text.charCodeAt(0) === 0x2d ? 1 : 0;
  const isDigit = (at: number) => at < n && text.charCodeAt(at) >= 0x30 && text.charCodeAt(at) <= 0x39;
  const start = i;
  while (i < n && text.charCodeAt(i) === 0x30) i++;
  const significant = i;
  while (isDigit(i)) i++;
  if (i === start) return { kind: "none" };
  if (i === n) return { kind: "integer", negative: start === 1, digits: text.slice(significant) };
  if (text.charCodeAt(i) === 0x2e) {
    i++;
    if (!isDigit(i)) return { kind: "none" };
    while (isDigit(i)) i++;
  }
  if (i < n && (text.charCodeAt(i) | 0x20) === 0x65) {
    i++;
    if (i < n && (text.charCodeAt(i) === 0x2b || text.charCodeAt(i) === 0x2d)) i++;
    if (!isDigit(i)) return { kind: "none" };
    while (isDigit(i)) i++;
  }
  return i === n ? { kind: "decimal" } : { kind: "none" };
}

/**
 * The integer a JSON string holds, as `priority` takes one (`"2"`, `"-3"`, `"007"`: an optional
 * `-` and decimal digits; Connect JSON's integer fields read their strings the same way); `"huge"`
 * past 20 digits (beyond every 64-bit integer: never parsed, however long); else the type fault
 * (`"2.0"`, `"1e2"`: not an integer; `"0x10"`, `" 5"`, `"+2"`: not a number).
 */
export function integerInString(value: string, param: string): bigint | "huge" | ApiError {
  const numeral = classifyNumeral(value);
  if (numeral.kind !== "integer") {
    return invalidType(param, numeral.kind === "decimal" ? "an integer" : "a number");
  }
  if (numeral.digits.length > 20) return "huge";
  const magnitude = BigInt(numeral.digits === "" ? "0" : numeral.digits);
  return numeral.negative ? -magnitude : magnitude;
}
