// Waiting for a whole KV dump on a job that keeps stepping, shared by the tests that fault a job
// (test/faults.test.ts, test/netns.test.ts).

/** What wholeDumpAfter reads of a manifest. */
export interface DumpOutcome {
  arm_wave: number;
  complete: boolean;
  timed_out: boolean;
  failed_ranks: Record<string, string>;
  skipped_ranks?: Record<string, string>;
}

/**
 * Ask for manual dumps (`ask(n)` raises dump.manual_dump to n = first, first + 1, ...) until one
 * armed after wave `since` is complete, and return it. A dump whose wave vector reached a rank after
 * its end_of_wave fails there (the engine does not wait): on a loaded host that can happen to any
 * dump, so once every manifest seen has settled short of whole, the next is asked for. `until` is
 * the caller's waitFor (with its diagnostics); every failure seen must be of that kind.
 */
export async function wholeDumpAfter<M extends DumpOutcome>(
  manifests: () => M[],
  since: number,
  first: number,
  ask: (n: number) => void,
  until: (fn: () => M | undefined, what: string, ms: number) => Promise<M>,
  timeoutMs: number,
): Promise<M> {
  const after = () => manifests().filter((m) => m.arm_wave > since);
  const settled = (m: M) => m.complete || m.timed_out || Object.keys(m.failed_ranks).length > 0 || Object.keys(m.skipped_ranks ?? {}).length > 0;
  let next = first;
  let seen = 0;
  ask(next++);
  const whole = await until(
    () => {
      const ms = after();
      const done = ms.find((m) => m.complete);
      if (!done && ms.length > seen && ms.every(settled)) {
        seen = ms.length;
        ask(next++);
      }
      return done;
    },
    `a complete dump armed after wave ${since}`,
    timeoutMs,
  );
  for (const m of after()) {
    for (const err of Object.values(m.failed_ranks)) expect(err).toMatch(/arrived after end_of_wave/);
    for (const why of Object.values(m.skipped_ranks ?? {})) expect(why).toBe('wave_already_ended');
  }
  return whole;
}
