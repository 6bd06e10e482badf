// The tensor hot path (docs/python-client.md, "The tensor hot path"): a Python engine passes
// columns through the telemetry ring; the coordinator's detectors get exactly the columns the
// dict path gives for the same steps, a detector fires on them, and garbage in the ring is
// counted per rank and never passed on.
import * as fs from 'fs';
import * as path from 'path';
import { decode, messageType } from '../src/proto';
import { PYTHON, ROOT, cleanup, runPython, spawnTracked, waitFor } from './helpers';
import { startHarnessJob, stopHarnessJob, type HarnessJob } from './job-harness';
import { TENSOR_HEAD_CFG as CFG, expectDictColumns, expectEveryWaveInOrder, recordHeads as record } from './tensor-head-parity';

afterAll(cleanup);
jest.setTimeout(120000);

const ENV = { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python'), PYTHONDONTWRITEBYTECODE: '1' };

// The steps: arrivals, tokens per row, finishes and frees; a repeated token on row 0 (req "a").
const DRIVER = `
import json, sys, numpy as np
from wavebus_client import Client, RequestStep
from wavebus_client.wave_head import WaveHeadBuilder

run_dir, garbage, rehello, few_events, bt_mode = sys.argv[1], sys.argv[2] == "1", sys.argv[2] == "2", sys.argv[2] == "3", sys.argv[2] == "4"
c = Client.connect(env={"WAVEBUS_RUN_DIR": run_dir, "LOCAL_RANK": "0"})
batch = c.tensor_batch(8, vocab=1000, max_events=0 if few_events else None)
# bt_mode: the engine's own block table (written in place) registered once, instead of blocks() calls.
bt, bn = np.full((8, 4), -1, dtype=np.int32), np.zeros(8, dtype=np.int32)
if bt_mode:
    batch.block_table(bt, bn)
def set_blocks(r, ids):
    tables[r] = ids
    if bt_mode:
        bt[r, :] = -1; bt[r, :len(ids)] = ids; bn[r] = len(ids)
    else:
        batch.blocks(r, ids)
import time
from wavebus_client.mailbox import FEATURE_BUS
t_end = time.monotonic() + 30  # the agent turns the bus on once its coordinator's config is in force
while not c.features & FEATURE_BUS and time.monotonic() < t_end:
    time.sleep(0.01)
c.hello()  # at once (the ring is made then), not lazily within the first head's bound
ref = WaveHeadBuilder()
live = {}     # row -> req id
tables = {}
out = {"dict": [], "sent": 0}
for wave in range(1, 41):
    rows, toks, lps, reqs = [], [], [], []
    if wave == 1:
        for r, q in ((0, "a"), (1, "b"), (2, "c")):
            batch.arrive(r, q, prompt_len=5); live[r] = q
            set_blocks(r, [r, r + 8])
    if wave == 12:
        batch.arrive(1, "d", prompt_len=3); live[1] = "d"; set_blocks(1, [9])
    if wave == 20:
        set_blocks(2, [2, 10, 11])
    for r in sorted(live):
        rows.append(r); toks.append(7 if r == 0 else (wave * 13 + r) % 1000); lps.append(-0.5 - r)
    fin = [1] if wave == 10 else []
    freed = [1] if wave == 11 else []
    for r in fin: batch.finish(r)
    for r in freed: batch.free(r)
    for i, r in enumerate(rows):
        reqs.append(RequestStep(req_id=live[r], new_token_ids=[toks[i]], new_token_logprobs=[lps[i]], block_ids=tables[r],
                                finished=r in fin, freed=r in freed, prompt_len=5 if live[r] != "d" else 3))
    body = ref.build(wave, {"requests": reqs}, True, c._mb.epoch)
    out["dict"].append(body.telemetry.columns.SerializeToString().hex())
    if rehello and wave == 20:
        c._rejoin(); c.hello()  # a hello again (an agent back, a second tensor_batch): a fresh ring file
    if garbage and wave == 30:
        lps[0] = float("nan")
    if garbage and wave == 31:
        toks[0] = 5000
    out["sent"] += batch.wave_head(wave, np.array(rows, dtype=np.int64), np.array(toks, dtype=np.int32), np.array(lps, dtype=np.float32))
    for r in freed:
        live.pop(r)
    ended = c.end_of_wave(wave)
out["stats"] = batch.stats
out["client"] = dict(c.stats, last_error=c.last_error)
c.close()
print(json.dumps(out))
`;

async function drive(job: HarnessJob, garbage: boolean | 'rehello' | 'few_events' | 'block_table', native = 'auto'): Promise<{ dict: string[]; sent: number; stats: Record<string, number>; client: Record<string, unknown> }> {
  const p = spawnTracked(PYTHON, ['-c', DRIVER, path.join(job.root, 'run'), garbage === 'rehello' ? '2' : garbage === 'few_events' ? '3' : garbage === 'block_table' ? '4' : garbage ? '1' : '0'], { env: { ...ENV, WAVEBUS_PY_NATIVE: native } });
  const { code } = await p.exited;
  if (code !== 0) throw new Error(`python exited ${code}: ${p.stderr()}`);
  return JSON.parse(p.stdout());
}

/** The driver's dict-path columns (hex of TelemetryColumns), in wire form. */
function dictColumns(hex: string[]): Record<string, any>[] {
  const TelemetryColumns = messageType('TelemetryColumns');
  return hex.map((h) => decode(TelemetryColumns, Buffer.from(h, 'hex')) as Record<string, any>);
}

// Both ring writers of the Python client: its native C call (test/python-native.test.ts builds it) and numpy's.
beforeAll(() => {
  // The Python client's native path from the current sources (npm install and the preflight build it too).
  expect(require('../scripts/build-python-native').build()).toBe(true); // eslint-disable-line @typescript-eslint/no-var-requires
});

test.each([['native', '1'], ['numpy', '0']])('the ring path (%s writes) gives the coordinator the dict path\'s columns, and token_repeat fires on them', async (which, native) => {
  const job = await startHarnessJob({ tp: 1, runtimeConfig: CFG });
  try {
    const seen = record(job);
    const got = await drive(job, false, native);
    if (got.sent !== 40) throw new Error(`sent ${got.sent} of 40 heads: ${JSON.stringify(got.client)}`);
    expect(got.stats.ring_heads).toBe(40);
    expect(got.client[`ring_${which}_writes`]).toBe(40);
    await waitFor(() => seen.length === 40, 'every head at the coordinator');
    expectDictColumns(seen, dictColumns(got.dict));
    await waitFor(() => fs.existsSync(job.reportRoot) && fs.readdirSync(job.reportRoot).length > 0, 'the token_repeat incident report');
  } finally {
    await stopHarnessJob(job);
  }
});

test('a registered block table (the engine writes it in place, no blocks() calls) gives the coordinator the same columns', async () => {
  const job = await startHarnessJob({ tp: 1, runtimeConfig: CFG });
  try {
    const seen = record(job);
    const got = await drive(job, 'block_table');
    if (got.sent !== 40) throw new Error(`sent ${got.sent} of 40 heads: ${JSON.stringify(got.client)}`);
    // Rows 0-2 at wave 1, row 1's new request at wave 12, row 2's third block at wave 20: five tables.
    expect(got.stats).toMatchObject({ ring_heads: 40, block_rows_sent: 5, bad_block_rows: 0 });
    await waitFor(() => seen.length === 40, 'every head at the coordinator');
    expectDictColumns(seen, dictColumns(got.dict));
  } finally {
    await stopHarnessJob(job);
  }
});

test('garbage in the ring (a token id past the vocab) is dropped and counted per rank; a NaN log-prob goes on as from the dict path; the heads go on', async () => {
  const job = await startHarnessJob({ tp: 1, runtimeConfig: CFG });
  try {
    const seen = record(job);
    const got = await drive(job, true);
    expect(got.sent).toBe(40);
    await waitFor(() => seen.length === 40, 'every head at the coordinator');
    expect(job.ranks[0].agent.ringStats.ringGarbage).toBe(1);
    expect(job.ranks[0].agent.ringStats.ringGarbageByKind).toEqual({ token_out_of_range: 1 });
    // A NaN log-prob (a model gone bad makes them) reaches the detectors as the dict path sends it.
    expect(seen[29].columns!.tokenIds.length).toBe(3);
    expect(Number.isNaN(seen[29].columns!.tokenLogprobs[0])).toBe(true);
    // The bad step keeps its rows and flags, without tokens.
    expect(seen[30].columns!.tokenIds.length).toBe(0);
    expect(seen[30].columns!.rows).toBe(3);
    expect(seen[31].columns!.tokenIds.length).toBe(3);
    await waitFor(() => (job.coordinator as any).vectors.status().ringGarbage['0'] === 1, 'ring garbage in the coordinator status (heartbeat)');
  } finally {
    await stopHarnessJob(job);
  }
});

test('a hello again makes a fresh ring file at the same path: the client maps the new one and no head is lost', async () => {
  const job = await startHarnessJob({ tp: 1, runtimeConfig: CFG });
  try {
    const seen = record(job);
    const got = await drive(job, 'rehello');
    if (got.sent !== 40) throw new Error(`sent ${got.sent} of 40 heads: ${JSON.stringify(got.client)}`);
    expect(got.stats.ring_heads).toBe(40);
    await waitFor(() => {
      if (seen.length !== 40) throw new Error(`${seen.length} heads: ${seen.map((t) => t.wave).join(',')}; agent ${JSON.stringify(job.ranks[0].agent.ringStats)}`);
      return true;
    }, 'every head at the coordinator');
    expectEveryWaveInOrder(seen);
    expect(job.ranks[0].agent.ringStats.ringGarbage).toBe(0);
  } finally {
    await stopHarnessJob(job);
  }
});

test('a step with more finish/free events than the ring holds goes inline; the whole ring heads after it never overtake it', async () => {
  const job = await startHarnessJob({ tp: 1, runtimeConfig: CFG });
  try {
    const seen = record(job);
    const got = await drive(job, 'few_events');
    expect(got.sent).toBe(40);
    expect(got.stats).toMatchObject({ ring_heads: 38, inline_heads: 2 }); // waves 10 (finish) and 11 (free)
    await waitFor(() => seen.length === 40, 'every head at the coordinator');
    expectEveryWaveInOrder(seen);
    expectDictColumns(seen, dictColumns(got.dict));
  } finally {
    await stopHarnessJob(job);
  }
});

// The head's sparse part is joined from bytes each binding and table was encoded to once
// (head_bytes.py): it must be what the protobuf library writes for the same message, byte for byte,
// through arrivals, re-sends, tables, finishes, frees and resend_all in random order.
const BYTES = `
import random
from wavebus_client import wavebus_pb2 as pb
from wavebus_client.errors import ConfigError
from wavebus_client.head_bytes import head_bytes
from wavebus_client.slot_batch import SlotEvents
random.seed(7)
checked = 0
for trial in range(40):
    s = SlotEvents(random.choice([3, 8, 64]))
    for step in range(150):
        for _ in range(random.randint(0, 8)):
            op, row = random.random(), random.randrange(s.max_rows)
            try:
                if op < 0.3: s.arrive(row, f"q{trial}-{step}-{row}", random.choice([0, 5, 300]), [1, 2**32 - 1] if random.random() < 0.2 else None)
                elif op < 0.55: s.blocks(row, [random.randrange(2**32) for _ in range(random.randint(0, 40))])
                elif op < 0.7: s.finish(row)
                elif op < 0.85: s.free(row)
                else: s.resend_all()
            except ConfigError:
                pass
        wave = random.choice([0, 1, 127, 128, 2**40 + step])
        cols = s.sparse_bytes()
        nf = pb.NonFiniteRow(row=3) if random.random() < 0.2 else None
        got = head_bytes(wave, wave - 1 if wave else 0, cols, pb.StepTelemetry(non_finite=[nf]).SerializeToString() if nf else b"")
        ref = pb.WaveHeadRequest(wave=wave)
        ref.telemetry.wave = wave - 1 if wave else 0
        if cols: ref.telemetry.columns.MergeFromString(cols)  # nothing added leaves it unset, as fill() did
        if nf: ref.telemetry.non_finite.append(nf)
        assert got == ref.SerializeToString(), (trial, step, got, ref.SerializeToString())
        assert pb.TelemetryColumns.FromString(cols).SerializeToString() == cols
        checked += 1
        if random.random() < 0.9: s.sent()
print(checked)
`;

test("the head's sparse part, joined from bytes encoded once per event, is the protobuf library's message byte for byte", () => {
  expect(runPython(BYTES, [], { env: ENV }).trim()).toBe('6000');
});

// What the head's sparse part carries, against a model of the engine's own rows (not of the
// client's code): every new binding and changed table goes with the next head, only live rows'
// current bindings and tables ever go, a freed row's never after the head that freed it, every
// live binding within two rounds of re-sends, all of them after resend_all(); the events come in
// call order; garbage rows are refused. The usual step takes a shortcut (map over the round's four
// re-sends) and the rest go row by row; both must keep to this.
const SELECTION = `
import random
from wavebus_client import wavebus_pb2 as pb
from wavebus_client.errors import ConfigError
from wavebus_client.slot_batch import RESEND_PER_STEP, SlotEvents
random.seed(11)
checked = 0
for trial in range(30):
    quiet = trial % 2 == 0  # a full batch with few events: the usual step's shortcut
    m = random.choice([16, 64] if quiet else [2, 5, 16, 64])
    s = SlotEvents(m)
    live, tables, last, last_t = {}, {}, {}, {}  # last, last_t: the head a row's binding, its table last went with
    new_b, new_t = set(), set()
    head = 0
    for row in range(m if quiet else 0):
        live[row], tables[row] = f"q{trial}-{row}", [row]
        s.arrive(row, live[row], 1); s.blocks(row, [row])
        new_b.add(row); new_t.add(row)
    for step in range(200):
        events, everything = {}, False
        for _ in range(int(random.random() < 0.1) if quiet else random.randint(0, 8)):
            op, row = random.random(), random.randrange(m)
            if op < 0.35 and row not in live:
                live[row] = f"q{trial}-{step}-{row}"
                s.arrive(row, live[row], 1)
                tables.pop(row, None); new_t.discard(row); new_b.add(row)
            elif op < 0.55 and row in live:
                ids = [random.randrange(50) for _ in range(random.randint(0, 3))]
                s.blocks(row, ids)
                if tables.get(row) != ids:
                    tables[row] = ids; new_t.add(row)
            elif op < 0.7 and row in live:
                s.finish(row); events[row] = events.get(row, 0) | 1
            elif op < 0.85 and row in live:
                s.free(row); events[row] = events.get(row, 0) | 2
            elif op < 0.88:
                s.resend_all(); everything = True
            else:
                bad = random.choice([row, 1.0, True, -1, m, "0"])
                if bad in live and type(bad) is int:
                    continue
                for call in (s.finish, s.free):
                    try:
                        call(bad)
                        raise AssertionError(f"{call.__name__}({bad!r}) passed")
                    except ConfigError:
                        pass
        assert s.event_columns() == (list(events), list(events.values())), (trial, step)
        if random.random() < 0.8:  # else: sending paused, nothing went (the frees still take effect)
            head += 1
            cols = pb.TelemetryColumns.FromString(s.sparse_bytes())
            binds = {b.slot: b.req_id for b in cols.bind}
            tabs = {t.slot: list(t.block_ids) for t in cols.blocks}
            # (a row may go twice in a head when fewer rows are live than a head re-sends)
            assert all(live.get(b.slot) == b.req_id for b in cols.bind), (trial, step, "not live or not current")
            assert all(tables.get(t.slot) == list(t.block_ids) for t in cols.blocks), (trial, step, "a stale table")
            assert new_b <= set(binds) and new_t <= set(tabs), (trial, step, "a new one left out")
            if everything:
                assert set(binds) == set(live) and set(tabs) == set(tables), (trial, step, "resend_all")
            last.update(dict.fromkeys(binds, head))
            last_t.update(dict.fromkeys(tabs, head))
            new_b, new_t = set(), set()
            bound = 2 * (m // RESEND_PER_STEP + 1)
            late = [r for r in live if head - last[r] > bound] + [r for r in tables if head - last_t[r] > bound]
            assert not late, (trial, step, late)
        s.sent()
        for r, f in events.items():
            if f & 2:
                del live[r]; tables.pop(r, None); last.pop(r, None); last_t.pop(r, None); new_b.discard(r); new_t.discard(r)
        checked += 1
print(checked)
`;

test("the head's sparse part carries what is new, re-sends every live row in turn and nothing freed; bad rows are refused", () => {
  expect(runPython(SELECTION, [], { env: ENV }).trim()).toBe('6000');
});
