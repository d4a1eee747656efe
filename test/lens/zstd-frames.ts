// Hand-built zstd frames for tests: RLE blocks give a valid frame that inflates 32768:1.

const RLE_BLOCK = 128 * 1024;

/**
 * A zstd frame of `blocks` RLE blocks of 128 KiB of `byte` each (4 bytes per block, so 8192
 * blocks — 32 KiB — inflate to 1 GiB). Window 128 KiB; `declaredSize` puts an 8-byte frame
 * content size in the header (any value, true or not), else the header declares none.
 */
export function rleZstdFrame(blocks: number, byte = 0, declaredSize?: bigint): Uint8Array {
  const header = declaredSize === undefined ? 6 : 14;
  const out = new Uint8Array(header + blocks * 4);
  const view = new DataView(out.buffer);
  view.setUint32(0, 0xfd2fb528, true); // magic
  out[4] = declaredSize === undefined ? 0x00 : 0xc0; // FCS_Field_Size 8 bytes when declared, no checksum
  out[5] = 7 << 3; // Window_Descriptor: windowLog 17 (128 KiB)
  if (declaredSize !== undefined) view.setBigUint64(6, declaredSize, true);
  for (let i = 0; i < blocks; i++) {
    const last = i === blocks - 1 ? 1 : 0;
    const blockHeader = (RLE_BLOCK << 3) | (1 << 1) | last; // Block_Type 1 = RLE
    const at = header + i * 4;
    out[at] = blockHeader & 0xff;
    out[at + 1] = (blockHeader >>> 8) & 0xff;
    out[at + 2] = (blockHeader >>> 16) & 0xff;
    out[at + 3] = byte;
  }
  return out;
}
