"""The running requests of the Python bench engines (bench/client_engine.py, bench/overhead_engine.py):
N rows, each request lives about FINISH_EVERY steps, a finished request's row takes a new request
after the head that carried its free (an engine pays each arrival once, as it schedules it).
One module, so both benches step the same batch."""
import numpy as np

FINISH_EVERY = 200  # each request runs ~200 steps: about n / 200 finish per step
PROMPT_LEN = 16


class BenchRequests:
    def __init__(self, n: int, rng):
        self.n = n
        self.rows = np.arange(n, dtype=np.int64)
        self.req = [f"req-{r}" for r in range(n)]
        self.age = rng.integers(0, FINISH_EVERY, n)
        self._next_id = n
        self._arrivals = []

    def table(self, row: int):
        """A row's block table (two blocks, distinct per row)."""
        return [row, row + self.n]

    def bind_all(self, batch) -> None:
        """Every row takes its first request (before the first step)."""
        for r in range(self.n):
            batch.arrive(r, self.req[r], prompt_len=PROMPT_LEN)
            batch.blocks(r, self.table(r))

    def finishing(self):
        """One step older: the rows whose requests finish this step."""
        self.age += 1
        return np.flatnonzero(self.age >= FINISH_EVERY).tolist()

    def renew(self, done) -> None:
        """The finished rows' next requests (ids only; they arrive with arrive_after_head)."""
        for r in done:
            self.req[r] = f"req-{self._next_id}"
            self._next_id += 1
            self.age[r] = 0

    def arrive_after_head(self, batch, done) -> None:
        """Rows freed at the last step take their new requests now (after the head that carried the
        free); this step's go at the next call."""
        if batch is not None:
            for r in self._arrivals:
                batch.arrive(r, self.req[r], prompt_len=PROMPT_LEN)
                batch.blocks(r, self.table(r))
        self._arrivals = done
