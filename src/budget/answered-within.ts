/**
 * `work`'s outcome, or a rejection with `Error(message())` once `waitMs` ms passed with it still
 * pending (the work itself goes on). Used where a store's answer is only worth something while a
 * Hold or lease still stands: a store that never answers fails the request closed, not hung.
 */
export function answeredWithin<T>(work: Promise<T>, waitMs: number, message: () => string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(message())), waitMs);
  });
  return Promise.race([work, late]).finally(() => clearTimeout(timer));
}
