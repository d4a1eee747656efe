// Text the gateway did not write (a caller's field name or value, Inference's error message) is
// echoed in error messages and params only up to a bound, so an error never carries a whole body.

/** Longest piece of caller text echoed in an error message or param, in UTF-16 code units. */
export const MAX_ECHO_CHARS = 200;

/**
 * Longest message of Inference passed on to a caller, in UTF-16 code units. Longer than
 * {@link MAX_ECHO_CHARS} because vLLM's own messages are whole sentences (its context-length
 * message is ~250 characters); its pydantic messages can echo a whole request field.
 */
export const MAX_UPSTREAM_MESSAGE_CHARS = 1024;

/**
 * `text` cut to at most `max` UTF-16 code units plus an ellipsis (`…`) that marks the cut; text
 * within the bound is returned as it is. A cut never splits a surrogate pair (it then keeps one
 * unit less). The one clipping rule for every echoed text: caller input (default bound 200) and
 * Inference's error messages ({@link MAX_UPSTREAM_MESSAGE_CHARS}).
 */
export function clip(text: string, max: number = MAX_ECHO_CHARS): string {
  if (text.length <= max) return text;
  const last = text.charCodeAt(max - 1);
  const end = last >= 0xd800 && last <= 0xdbff ? max - 1 : max;
  return `${text.slice(0, end)}…`;
}
