// Processes that receive multi-MiB ZeroMQ frames (the coordinator relaying file chunks, the
// aggregate tool) keep freed memory for reuse: with glibc's defaults every 2 MiB frame lands on
// freshly mapped pages and pays a page fault per 4 KiB, which on a VM costs more than moving the
// bytes (docs/aggregate.md). Set WAVEBUS_MALLOC_TUNING=0 to keep the C library's defaults.
import { native } from './native';

/** Allocations up to this size come from the heap (and are reused) instead of fresh mmaps. */
export const MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024;
/** Freed memory at the top of the heap is returned to the kernel only beyond this. */
export const TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024;

/** Apply the tuning to this process; false when it is off or the C library is not glibc. */
export function keepFreedMemory(env: NodeJS.ProcessEnv = process.env): boolean {
  if (env.WAVEBUS_MALLOC_TUNING === '0') return false;
  return native.tuneMalloc(MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES);
}
