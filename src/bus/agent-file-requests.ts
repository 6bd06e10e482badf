// An agent's answers to the coordinator's file requests (fileList / fileChunk / fileServe, for
// `aggregate`): the agent's handler (file-server.ts) answers; apart from agent-bus.ts, which only syncs.
import type { RequestHandler } from './agent-bus-types';
import type { CoordinatorMsg } from './frames';

/** Answer `req` with `handler`'s body, or with an error naming the rank (no handler, or it failed). */
export function answerFileRequest(handler: RequestHandler | undefined, req: CoordinatorMsg, rank: number, send: (body: Record<string, unknown>, requestId: number) => void): void {
  const kind = req.body as 'fileList' | 'fileChunk' | 'fileServe' | 'decidedColumn' | 'replay';
  const fail = (error: string) => send({ [kind]: { globalRank: rank, error } }, req.requestId);
  if (!handler) {
    fail(`rank ${rank}: this agent does not serve ${kind} requests`);
    return;
  }
  handler(req).then(
    (body) => send(body, req.requestId),
    (e) => fail(`rank ${rank}: ${String((e as Error)?.message ?? e)}`),
  );
}
