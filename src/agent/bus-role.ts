// What an agent does on the wave bus, by pipeline stage, in the words its startup log uses.
// Every agent given a coordinator joins the bus (dump.pp_stages "all" needs every stage there);
// the seed's rule, that only the last stage takes the due broadcast and the others follow the
// config file, is kept in what each stage acts on, not in who joins (docs/runtime-guard.md).

/** The startup log line of an agent that joined the bus as pipeline stage ppRank of pp. */
export function busRoleLine(id: { ppRank: number; pp: number; isLastPp: boolean }): string {
  const stage = `pp stage ${id.ppRank} of ${id.pp}`;
  if (id.isLastPp) {
    return `joins the wave bus as ${stage} (the last): its engine reads the wave vector every step while the bus is active (hot reload, a detector or a manual dump on), it copies KV dumps, and bus readiness waits for it`;
  }
  return (
    `joins the wave bus as ${stage} (not the last): it follows the config lane (applied at its wave), copies KV dumps ` +
    `only while dump.pp_stages is "all", and its engine reads the wave vector only then or while a config is due; bus readiness does not wait for it`
  );
}
