// Requests awaiting a reply, correlated by request id, each with its own timer: the coordinator's
// requests to agents and the tools' requests to the coordinator keep them here. A reply settles
// its request once; a late reply (after the timeout) finds nothing and is the caller's to count.

interface Pending<T, M> {
  meta: M;
  resolve: (v: T) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

export class RequestMap<T, M = undefined> {
  private readonly pending = new Map<number, Pending<T, M>>();
  private nextId = 1;

  /** `timeoutError`: the error a request rejects with when its timer fires. */
  constructor(private readonly timeoutError: (id: number, meta: M, timeoutMs: number) => Error) {}

  /** A new request id and the promise its reply (or timeout) settles. */
  open(timeoutMs: number, meta: M): { id: number; reply: Promise<T> } {
    const id = this.nextId++;
    const reply = new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(this.timeoutError(id, meta, timeoutMs));
      }, timeoutMs);
      this.pending.set(id, { meta, resolve, reject, timer });
    });
    return { id, reply };
  }

  /** What the request `id` was opened with, while it waits. */
  meta(id: number): M | undefined {
    return this.pending.get(id)?.meta;
  }

  has(id: number): boolean {
    return this.pending.has(id);
  }

  /** Settle `id` with its reply; false when it is not waiting (timed out, never sent). */
  resolve(id: number, value: T): boolean {
    const p = this.take(id);
    p?.resolve(value);
    return p !== undefined;
  }

  reject(id: number, e: Error): boolean {
    const p = this.take(id);
    p?.reject(e);
    return p !== undefined;
  }

  /** Reject every waiting request (the owner is closing). */
  rejectAll(error: (id: number, meta: M) => Error): void {
    for (const id of [...this.pending.keys()]) this.reject(id, error(id, this.pending.get(id)!.meta));
  }

  get size(): number {
    return this.pending.size;
  }

  private take(id: number): Pending<T, M> | undefined {
    const p = this.pending.get(id);
    if (!p) return undefined;
    this.pending.delete(id);
    clearTimeout(p.timer);
    return p;
  }
}
