// Every command line shown in README.md and docs/*.md (sh / bash / shell / console code blocks;
// test/doc-commands.ts reads them) is either run here, as written, in a temp dir of its own, or
// listed in SKIPPED with why it cannot run on this machine. A new command in the docs that is
// neither fails this test, so the docs cannot drift from the code. Every `wavebus` command shown,
// skipped or not, must name a subcommand that exists and only flags its --help lists; every
// `npm run` script and repository path it names must exist.
import { execFile, spawnSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { promisify } from 'util';
import { CLI, ROOT, cleanup, tmpDir } from './helpers';
import { COMMAND_WORDS, blocks, docCommands, docFiles, readerPath, wavebusCalls, words, type DocCommand } from './doc-commands';

afterAll(cleanup);

const run = promisify(execFile);

interface Runnable {
  /** Where it runs: the doc's temp dir (the default, also $HOME there), or the repository root. */
  cwd?: 'repo';
  /** Shell run first in the same dir: what the doc's prose says to do before this command. */
  setup?: string;
  /** What the command must have done, beyond exit status 0. */
  check: (dir: string, stdout: string) => void;
}

function keyPair(dir: string, name: string): void {
  expect(fs.statSync(path.join(dir, `${name}.key`)).mode & 0o777).toBe(0o600);
  expect(fs.readFileSync(path.join(dir, `${name}.pub`), 'utf8')).toMatch(/\S{40}/);
}

function allowList(file: string, names: string[]): void {
  const lines = fs.readFileSync(file, 'utf8').trim().split('\n');
  expect(lines.map((l) => l.split(' ')[1]).sort()).toEqual([...names].sort());
}

/** Commands run here, as written (keyed by their text; one entry serves every doc that shows it). */
const RUNNABLE: Record<string, Runnable> = {
  'wavebus keys --out keys --name coordinator': { check: (d) => keyPair(path.join(d, 'keys'), 'coordinator') },
  'wavebus keys --out keys --name agent': { check: (d) => keyPair(path.join(d, 'keys'), 'agent') },
  'wavebus keys --out ~/wavebus-keys --name coordinator': { check: (d) => keyPair(path.join(d, 'wavebus-keys'), 'coordinator') },
  'wavebus keys --out ~/wavebus-keys --name agent': { check: (d) => keyPair(path.join(d, 'wavebus-keys'), 'agent') },
  'wavebus keys --out trusted --name coordinator': { check: (d) => keyPair(path.join(d, 'trusted'), 'coordinator') },
  // security.md: "collect the public keys ... into one directory".
  'wavebus keys --allow-list pubs/ > allow.txt': {
    setup: 'mkdir -p pubs && cp keys/coordinator.pub keys/agent.pub pubs/',
    check: (d) => allowList(path.join(d, 'allow.txt'), ['coordinator', 'agent']),
  },
  // launch.md: "copy keys/agent.pub to pubs/host<i>.pub".
  'wavebus keys --allow-list pubs > keys/allowed': {
    setup: 'mkdir -p pubs && cp keys/agent.pub pubs/host0.pub',
    check: (d) => allowList(path.join(d, 'keys', 'allowed'), ['host0']),
  },
  // transformers.md: makes the torch 2 venv, or (as here, after npm test's preflight) checks and reuses it.
  'node scripts/torch2-venv.js': { cwd: 'repo', check: (_d, out) => expect(out).toMatch(/\.venv-torch2\/bin\/python \((reused|made) in/) },
  'bash scripts/host-costs.sh': { cwd: 'repo', check: (_d, out) => expect(JSON.parse(out)).toMatchObject({ syscall_us: expect.any(Number), round_trip_us: expect.any(Number) }) },
};

const SYNOPSIS = 'a synopsis ([optional] flags, placeholders): its subcommand and flags are checked against --help below';
const BENCH = 'a benchmark: runs for seconds to minutes and measures this host (npm run bench); its flags are checked against --help below';
const ENGINE = 'starts an engine that is not in this repository (serve.py) on GPU hosts';
const FAR_HOST = 'talks to another host (10.0.0.x): tests use loopback or network namespaces of their own only';

const HF_BISECT_WALK = 'a step of the walk from a TP=2 transformers capture to the first wrong module (torch 2\'s venv, a few minutes of CPU); test/transformers-bisect.test.ts runs the same launch, replays and bisects';
const BISECT_WALK = 'a step of the walk from a TP=2 PyTorch capture to the first wrong layer (a minute or more of CPU); test/bisect.test.ts runs the same launch, replays and bisects';
const LIVE_JOB = 'talks to a running job\'s coordinator on port 29600; test/control.test.ts runs status, dump and capture against a simulated job of its own';
const WALK = 'a step of docs/walkthrough.md, which test/newcomer-walk.test.ts runs in order, as written, read from the page (two demos, a live job, replays: a few minutes of CPU)';
const HF_WALK = 'a step of docs/transformers.md\'s first run, which test/newcomer-transformers.test.ts runs in order, as written, read from the page (a fresh venv, two TP=2 transformers jobs: minutes of CPU)';
const DEMO_TREE = 'reads the output of a `wavebus demo` (about two minutes of CPU; test/demo.test.ts checks the demo writes the page and the trace)';

/** Commands that cannot run here, each with why. */
const SKIPPED: Record<string, string> = {
  'npm install && npm link && wavebus demo':
    'npm install would rewrite the node_modules the suite runs from; the last test here runs its `npm link` (into a temp prefix) and every runnable command with the `wavebus` it links; test/demo.test.ts runs `wavebus demo` and test/package.test.ts `npx wavebus demo` from the installed package',
  'npm test': 'the suite this test is part of',
  'wavebus launch --nproc-per-node 2 --tp 2 -- torchrun --standalone --nproc-per-node 2 examples/transformers-engine/serve.py --model MODEL_DIR --out OUT':
    'a placeholder (MODEL_DIR: a model make_model.py writes) and torch 2\'s torchrun from the venv; test/transformers.test.ts runs the same launch',
  'wavebus launch --nnodes 2 --node-rank $NODE_RANK --nproc-per-node 8 --master-addr $MASTER --tp 8 --pp 2 --runtime-config-hot-reload --curve-dir /etc/wavebus/keys -- torchrun ... serve.py': `two hosts of eight GPUs; ${ENGINE}`,
  'wavebus aggregate --coordinator HOST:PORT --out DIR [--what all|snapshots|dumps] [--prefix REL] [--call N] [--chunk-mb 2] [--window 4] [--timeout-ms 30000] [--bus-token-file FILE] [--json] [--curve-dir DIR] [--relay] [--direct-timeout-ms 3000]': SYNOPSIS,
  'wavebus aggregate --coordinator 10.0.0.1:29600 --out ./incident --what dumps --prefix token_repeat/req-17/wave_342': FAR_HOST,
  'wavebus aggregate --coordinator 10.0.0.1:29600 --out ./call5 --what snapshots --prefix 3f9a.../ --call 5': FAR_HOST,
  'wavebus inspect ./call5 --verify': 'reads ./call5, which the aggregate from another host above writes (test/inspect.test.ts runs inspect --verify)',
  'wavebus launch --linger-ms 600000 ... -- python serve.py': `elided flags (...); ${ENGINE}`,
  'wavebus aggregate --coordinator $MASTER:29600 --out ./collected': 'needs the job launched above still lingering (test/aggregate.test.ts aggregates from a live job)',
  'wavebus aggregate --coordinator 10.0.0.5:29600 --curve-dir keys --out /tmp/incident': FAR_HOST,
  'npm run build': 'the tsc build npm test\'s pretest has just run before the suite',
  'node bin/wavebus.js bench bus --agents 8 --json': BENCH,
  'wavebus bench client --requests 1,64,256,1024,4096 --steps 150 --json': BENCH,
  'wavebus bench client --lang ts --requests 1,64,256,1024,4096 --json': BENCH,
  'wavebus bench client --lang python --requests 1,256,1024,4096 --json': BENCH,
  'wavebus bench client --lang ts --requests 1,256,1024,4096 --json': BENCH,
  'wavebus bench client --lang python --requests 256,1024,4096 --steps 300 --json': BENCH,
  'wavebus bench client --lang ts --requests 1024,4096 --steps 300 --json': BENCH,
  'wavebus bench client --lang python --requests 1024,4096 --json': BENCH,
  'wavebus bench client --lang python --requests 1024,4096 --forward spin --json': BENCH,
  'wavebus bench client --lang ts --requests 1024 --json': BENCH,
  'wavebus bench overhead --engine python --running 1024 --forward-ms 3 --rounds 3 --lookahead-waves 3 --cpu-window --json': BENCH,
  'wavebus bench overhead --engine python --running 1024 --forward-ms 3 --rounds 1 --steps 300 --lookahead-waves 3 --cpu-window --no-seed-baseline --json': BENCH,
  'wavebus bench overhead --engine python --running 1024 --forward-ms 3 --rounds 1 --steps 400 --lookahead-waves 3 --no-seed-baseline --cpu-window --rank-divergence --json': BENCH,
  'node bin/wavebus.js bench dump --size-mb 256 --format all --json': BENCH,
  'node bin/wavebus.js bench overhead --json': BENCH,
  'node bin/wavebus.js bench transformers --json': BENCH,
  'node bin/wavebus.js bench overhead --lookahead-waves 3 --cpu-by-process --json': BENCH,
  'node bin/wavebus.js bench overhead --forward-ms 3 --lookahead-waves 3 --ranks 2 --rounds 3 --cpu-by-process --syscalls --json': BENCH,
  'node bin/wavebus.js bench overhead --forward-ms 3 --lookahead-waves 3 --ranks 8 --rounds 1 --steps 1000 --cpu-by-process --syscalls --json': BENCH,
  'node bin/wavebus.js bench overhead --forward-ms 1 --lookahead-waves 3 --ranks 2 --rounds 3 --json': BENCH,
  'node bin/wavebus.js bench soak --agents 64 --waves 1000 --dp 2 --json': `${BENCH} (minutes: 64 agent processes)`,
  'node bin/wavebus.js bench soak --agents 16 --waves 1000 --dp 2 --json': BENCH,
  'node bin/wavebus.js bench detectors --requests 1024 --json': BENCH,
  'node bin/wavebus.js bench aggregate --size-mb 64 --json': BENCH,
  'sudo node bin/wavebus.js bench aggregate --netns --runs 3 --json': `${BENCH}; needs root for network namespaces`,
  'node bin/wavebus.js bench fuzz --frames 100000 --json': BENCH,
  'node bin/wavebus.js bench soak --agents 64 --waves 10000 --json': `${BENCH} (a few minutes)`,
  'wavebus coordinator [--host 127.0.0.1] [--port 29600] [--world-size N --tp T --pp P --dp D --cp C] [--heartbeat-ms 500] [--metrics-port P] [--dump-ack-timeout-ms 10000] [--insecure] [--lookahead-waves 1] [--curve-secret-key FILE --curve-allow FILE|DIR] [--bus-token-file FILE]': SYNOPSIS,
  'wavebus agent [--coordinator HOST:PORT] [--rank R --world-size N --tp T --pp P ...] [--heartbeat-ms 500] [--run-dir DIR] [--dump-root DIR] [--bus-token-file FILE] [--staging-mb 1024] [--cuda-staging-mb 8] [--curve-server-key FILE --curve-key FILE]': SYNOPSIS,
  'wavebus inspect out/runtime/report/kv_cache --verify': 'reads the output of a `wavebus demo --out out` (test/demo.test.ts verifies a demo\'s KV dumps with inspectTree, the code behind it)',
  'wavebus compare A B [--atol 0] [--rtol 0] [--assemble-tp] [--json] [--all] [--heatmap out.png|out.html]': SYNOPSIS,
  'wavebus compare run1/kv_cache/token_repeat/req-1/wave_40 run2/kv_cache/token_repeat/req-1/wave_40 --assemble-tp --heatmap diff.png': 'compares the dumps of two earlier runs (test/compare.test.ts runs compare --assemble-tp --heatmap)',
  'npx wavebus demo': 'about two minutes of CPU; test/demo.test.ts runs `wavebus demo` with these defaults (into a temp dir)',
  'npx wavebus demo --hosts 2 --tp 2 --pp 2 --format npy --out /tmp/demo': 'minutes of CPU and network namespaces; test/demo.test.ts runs this layout (--hosts 2 --tp 2 --pp 2 --format npy, with --dp 2)',
  'wavebus launch [--nnodes N] [--node-rank R] [--nproc-per-node L] [--master-addr A] [--port P] [--coordinator HOST:PORT] [--tp N --pp N --dp N --cp N] [--run-dir DIR] [--metrics-port P] [--insecure] [--ready-timeout-ms MS] [--grace-ms MS] [--coordinator-arg X ...] [--agent-arg X ...] -- <command...>': SYNOPSIS,
  'wavebus launch --nproc-per-node 8 --tp 8 -- python serve.py': ENGINE,
  'wavebus launch --nnodes 2 --node-rank $NODE_RANK --nproc-per-node 8 --master-addr $MASTER --tp 8 --pp 2 --insecure -- torchrun --nnodes 2 --node-rank $NODE_RANK --nproc-per-node 8 --master-addr $MASTER --master-port 29500 serve.py': `two hosts; ${ENGINE}`,
  'sbatch launch/slurm.sbatch': 'a Slurm cluster with GPU nodes (test/slurm.test.ts starts a one-node cluster and runs launch/slurm.sbatch)',
  'sbatch launch/slurm.sbatch ./engine.sh': 'a Slurm cluster and your engine (test/slurm.test.ts runs launch/slurm.sbatch with an engine script)',
  'WAVEBUS_NPROC=1 WAVEBUS_LAYOUT="--tp 2 --pp 2" WAVEBUS_CURVE_DIR=keys WAVEBUS_ADDITIONAL_CONFIG=\'{"runtime_report_dir":"…","runtime_config":{"detector":{"logits_finite":{"enabled":true,"on_trigger":["report","dump_kv"]}},…}}\' sbatch --wait --nodes=1 --ntasks-per-node=4 --cpus-per-task=1 --gpus-per-node=0 launch/slurm.sbatch engine.sh':
    'elided config (…); it is the run test/slurm.test.ts makes on a one-node cluster of its own',
  'wavebus launch --nnodes 4 --node-rank $I --nproc-per-node 2 --tp 2 --pp 2 --dp 2 --master-addr 10.0.0.1 --port 29600 --curve-dir keys --runtime-config-path /data/runtime/config/runtime_config.json --runtime-config-hot-reload --additional-config \'{"runtime_config": {"detector": {"token_repeat": {"enabled": true, "on_trigger": ["report", "dump_kv"]}}}}\' --snapshot-enable --snapshot-capture-token 17 --linger-ms 600000 -- python serve.py':
    `four hosts; ${FAR_HOST}; ${ENGINE}`,
  'wavebus aggregate --coordinator 10.0.0.1:29600 --curve-dir keys --out ./incident': FAR_HOST,
  'wavebus inspect ./incident --verify': 'reads ./incident, which the aggregate from another host above writes',
  'wavebus coordinator ... --additional-config \'{ "runtime_config_hot_reload": true, "runtime_config": { "detector": { "token_repeat": { "enabled": true }, "logits_finite": { "enabled": true } } } }\'':
    'elided flags (...): a coordinator runs until stopped, for a job',
  'wavebus coordinator --host 10.0.0.5 --curve-secret-key keys/coordinator.key --curve-allow pubs/': `${FAR_HOST} (test/security.test.ts runs the CURVE coordinator on loopback)`,
  'wavebus agent --coordinator 10.0.0.5:29600 --curve-server-key keys/coordinator.pub --curve-key keys/agent.key': `${FAR_HOST} (test/security.test.ts runs CURVE agents on loopback)`,
  'wavebus launch --curve-dir keys --nnodes 2 --node-rank $NODE_RANK --master-addr 10.0.0.5 ... -- python serve.py': `two hosts; ${ENGINE}`,
  'WAVEBUS_SNAPSHOT_ENABLE=1 WAVEBUS_SNAPSHOT_CAPTURE_TOKEN=104 WAVEBUS_SNAPSHOT_CAPTURE_REQUEST=abc WAVEBUS_SNAPSHOT_RANKS=0 WAVEBUS_SNAPSHOT_FORMAT=npy wavebus launch ...': `elided flags (...); ${ENGINE}`,
  'wavebus launch --nproc-per-node 2 --tp 2 -- .venv-torch2/bin/torchrun --standalone --nproc-per-node 2 examples/torch-engine/engine.py --out /tmp/eng --max-tokens 48':
    'two PyTorch ranks under torch 2\'s torchrun for a minute or more; test/torch-engine.test.ts runs this launch (with a port and an out dir of its own)',
  'wavebus launch --nproc-per-node 2 --tp 2 -- python3 examples/torch-engine/torchrun_env.py examples/torch-engine/engine.py --out /tmp/eng --max-tokens 48':
    'the stand-in where torch 2 is absent: two PyTorch ranks on Debian\'s torch for a minute or more; test/torch-engine.test.ts runs this launch in its torch 1.13 compatibility case',
  '.venv-torch2/bin/python examples/torch-engine/replay.py --snapshots $WAVEBUS_CACHE_ROOT/snapshots/torch-engine-tp2 --call 5 --engine-out /tmp/eng': 'replays the capture of the launch above (test/torch-engine.test.ts runs replay.py on one)',
  'wavebus bisect A B [--tol DTYPE=ATOL,RTOL ...] [--call N] [--json] [--out FILE.json]': SYNOPSIS,
  'wavebus verdict TREE --engine-out DIR [--incident ID] [--dp N] [--rank-host G=HOST[:DEVICE] ...] [--host-env HOST=FILE ...] [--other-host HOST] [--allow-live-device] [--no-reference] [--tol DTYPE=ATOL,RTOL ...] [--replayer-arg ARG ...] [--json] [--coordinator HOST:PORT [--bus-token-file FILE] [--curve-dir DIR] [--timeout MS]]': SYNOPSIS,
  'export WAVEBUS_CACHE_ROOT=/tmp/wb-bisect/cache': BISECT_WALK,
  'WAVEBUS_SNAPSHOT_ENABLE=1 WAVEBUS_SNAPSHOT_CAPTURE_REQUEST=req-1 WAVEBUS_SNAPSHOT_CAPTURE_TOKEN=20 WAVEBUS_SNAPSHOT_MAX_CAPTURES=1 wavebus launch --nproc-per-node 2 --tp 2 -- .venv-torch2/bin/torchrun --standalone --nproc-per-node 2 examples/torch-engine/engine.py --out /tmp/wb-bisect/eng --max-tokens 12': BISECT_WALK,
  'SNAP=$WAVEBUS_CACHE_ROOT/snapshots/torch-engine-tp2': BISECT_WALK,
  'CALL=$(ls $SNAP/rank0 | head -1 | cut -c5-)': BISECT_WALK,
  '.venv-torch2/bin/python examples/torch-engine/replay.py --snapshots $SNAP --call $CALL --engine-out /tmp/wb-bisect/eng --probe /tmp/wb-bisect/tp2': BISECT_WALK,
  '.venv-torch2/bin/python examples/torch-engine/replay.py --snapshots $SNAP --call $CALL --tp 1 --probe /tmp/wb-bisect/tp1': BISECT_WALK,
  'wavebus bisect /tmp/wb-bisect/tp2 /tmp/wb-bisect/tp1': BISECT_WALK,
  'export WAVEBUS_CACHE_ROOT=/tmp/wb-hf-bisect/cache': HF_BISECT_WALK,
  '.venv-torch2/bin/python examples/transformers-engine/make_model.py /tmp/wb-hf-bisect/model': HF_BISECT_WALK,
  'WAVEBUS_SNAPSHOT_ENABLE=1 WAVEBUS_SNAPSHOT_CAPTURE_REQUEST=req-1 WAVEBUS_SNAPSHOT_MAX_CAPTURES=2 wavebus launch --nproc-per-node 2 --tp 2 -- .venv-torch2/bin/torchrun --standalone --nproc-per-node 2 examples/transformers-engine/serve.py --model /tmp/wb-hf-bisect/model --out /tmp/wb-hf-bisect/out --requests 3 --max-tokens 6 --save-logits': HF_BISECT_WALK,
  'SNAP=$WAVEBUS_CACHE_ROOT/snapshots/transformers-LlamaForCausalLM-tp2': HF_BISECT_WALK,
  'PY=.venv-torch2/bin/python': HF_BISECT_WALK,
  '$PY examples/transformers-engine/replay.py --model /tmp/wb-hf-bisect/model --snapshots $SNAP --call 1 --engine-out /tmp/wb-hf-bisect/out --probe /tmp/wb-hf-bisect/tp2': HF_BISECT_WALK,
  '$PY examples/transformers-engine/replay.py --model /tmp/wb-hf-bisect/model --snapshots $SNAP --call 1 --tp 1 --probe /tmp/wb-hf-bisect/tp1': HF_BISECT_WALK,
  'wavebus bisect /tmp/wb-hf-bisect/tp2 /tmp/wb-hf-bisect/tp1': HF_BISECT_WALK,
  '$PY examples/transformers-engine/replay.py --model /tmp/wb-hf-bisect/model --snapshots $SNAP --call 1 --probe /tmp/wb-hf-bisect/bad --fault weight:1:model.layers.1.mlp.up_proj.weight': HF_BISECT_WALK,
  'wavebus bisect /tmp/wb-hf-bisect/bad /tmp/wb-hf-bisect/tp1': HF_BISECT_WALK,
  '.venv-torch2/bin/python examples/torch-engine/replay.py --snapshots $SNAP --call $CALL --probe /tmp/wb-bisect/bad --fault weight:1:layers.1.up': BISECT_WALK,
  'wavebus bisect /tmp/wb-bisect/bad /tmp/wb-bisect/tp1': BISECT_WALK,
  'wavebus bisect /tmp/wb-bisect/bad /tmp/wb-bisect/tp1 --out $WAVEBUS_CACHE_ROOT/bisect/tp2-vs-tp1.json': BISECT_WALK,
  'wavebus report $WAVEBUS_CACHE_ROOT -o /tmp/wb-bisect/report.html': `${BISECT_WALK}; test/report-bisect.test.ts runs bisect --out and report on probe trees`,
  'wavebus demo': WALK,
  'wavebus demo --engine torch --tp 2 --steps 120 --port 29600 &': WALK,
  'wavebus status --coordinator 127.0.0.1:29600 --bus-token-file wavebus-demo/bus.token --timeout 30000': WALK,
  'wavebus capture --coordinator 127.0.0.1:29600 --bus-token-file wavebus-demo/bus.token --next --wait': WALK,
  wait: `${WALK}; also ${HF_WALK}`,
  'wavebus report wavebus-demo -o incident.html': WALK,
  'SNAP=wavebus-demo/snapshots/torch-engine-tp2': WALK,
  'python3 examples/torch-engine/replay.py --snapshots $SNAP --call $CALL --tp 1 --probe tp1': WALK,
  'python3 examples/torch-engine/replay.py --snapshots $SNAP --call $CALL --probe bad --fault weight:1:layers.1.up': WALK,
  'wavebus bisect bad tp1': WALK,
  "python3 -m venv hf-venv": HF_WALK,
  "hf-venv/bin/pip install -q --index-url file:///opt/pypi/simple --extra-index-url file:///opt/pypi-more/simple --find-links /opt/wheels 'torch>=2,<3' 'transformers>=5,<6' accelerate safetensors numpy pyzmq protobuf ./clients/python": HF_WALK,
  "export PATH=$PWD/hf-venv/bin:$PATH": HF_WALK,
  "python examples/transformers-engine/make_model.py model": HF_WALK,
  "wavebus launch --nproc-per-node 2 --tp 2 --port 29600 --bus-token-dir . --runtime-config-hot-reload -- torchrun --standalone --nproc-per-node 2 examples/transformers-engine/serve.py --model model --out out --max-tokens 100 --step-sleep-ms 100 &": HF_WALK,
  "wavebus status --coordinator 127.0.0.1:29600 --bus-token-file bus.token": HF_WALK,
  "echo '{\"detector\": {\"token_repeat\": {\"enabled\": true, \"on_trigger\": [\"report\", \"dump_kv\"]}}, \"dump\": {\"auto_max_times\": 1}}' > runtime/config/runtime_config.json": HF_WALK,
  "wavebus launch --nproc-per-node 2 --tp 2 --port 29600 --bus-token-dir . -- torchrun --standalone --nproc-per-node 2 examples/transformers-engine/serve.py --model model --out out2 --max-tokens 100 --step-sleep-ms 200 &": HF_WALK,
  "wavebus dump --coordinator 127.0.0.1:29600 --bus-token-file bus.token --all --wait": HF_WALK,
  "wavebus report runtime -o incident.html": HF_WALK,
  'wavebus status --coordinator 127.0.0.1:29600': LIVE_JOB,
  'wavebus status --coordinator 127.0.0.1:29600 --json': LIVE_JOB,
  'wavebus dump --coordinator 127.0.0.1:29600 --request abc --wait': LIVE_JOB,
  'wavebus capture --coordinator 127.0.0.1:29600 --request abc --wait': LIVE_JOB,
  'wavebus dump --coordinator 127.0.0.1:29600 --all --wait': LIVE_JOB,
  'wavebus dump --coordinator 127.0.0.1:29600 --request abc --replica 1': LIVE_JOB,
  'wavebus capture --coordinator 127.0.0.1:29600 --token 104 --ranks 0 --format npy': LIVE_JOB,
  'wavebus capture --coordinator 127.0.0.1:29600 --next --wait': LIVE_JOB,
  'wavebus capture --coordinator 127.0.0.1:29600 --flush-recorder --wait': LIVE_JOB,
  'WAVEBUS_RECORD_FORWARDS=8 wavebus launch --nproc-per-node 2 --tp 2 -- .venv-torch2/bin/torchrun --standalone --nproc-per-node 2 examples/torch-engine/engine.py --out /tmp/eng':
    'runs the torch engine to its end with the recorder on (minutes on this host); test/recorder-torch.test.ts launches it with the recorder and kills it mid-run',
  '.venv-torch2/bin/python examples/torch-engine/replay.py --snapshots $WAVEBUS_CACHE_ROOT/snapshots/recorder/crash-run/torch-engine-tp2 --call 12 --engine-out /tmp/eng':
    'replays a crash flush of the launch above after a kill (test/recorder-torch.test.ts replays every flushed forward)',
  'node bin/wavebus.js bench recorder --json': BENCH,
  'npx wavebus report wavebus-demo -o incident.html': `${DEMO_TREE} (test/report.test.ts runs report on a real job's tree in Chromium)`,
  'npx wavebus trace wavebus-demo -o job.trace.json': `${DEMO_TREE} (test/trace.test.ts runs trace on a real job's tree)`,
  'npm run install': 'rebuilds the native addon from nothing (a minute of CPU) under the running suite; npm test\'s pretest builds it',
};

const commands = docCommands(ROOT);

test('every code block holding command lines is tagged sh, bash, shell or console (so the lines below find it)', () => {
  const untagged: string[] = [];
  for (const f of docFiles(ROOT)) {
    for (const b of blocks(ROOT, f)) {
      if (b.lang !== '') continue;
      b.lines.forEach((l, i) => {
        if (COMMAND_WORDS.test(l.trimStart() + ' ')) untagged.push(`${f}:${b.startLine + i}: ${l.trim()}`);
      });
    }
  }
  expect(untagged).toEqual([]);
});

test('every command shown is run here or listed in SKIPPED with why; no entry is left over', () => {
  expect(commands.length).toBeGreaterThan(40);
  const unlisted = commands.filter((c) => !(c.text in RUNNABLE) && !(c.text in SKIPPED)).map((c) => `${c.where}: ${c.text}`);
  // A new command: make it run here (RUNNABLE, with what it must do) or say why it cannot (SKIPPED).
  expect(unlisted).toEqual([]);
  const shown = new Set(commands.map((c) => c.text));
  expect(Object.keys(RUNNABLE).filter((t) => !shown.has(t))).toEqual([]);
  expect(Object.keys(SKIPPED).filter((t) => !shown.has(t))).toEqual([]);
  for (const [t, why] of Object.entries(SKIPPED)) expect([t, why.length > 20]).toEqual([t, true]);
});

test('every wavebus subcommand and flag shown exists (its --help lists it)', async () => {
  const calls = commands.flatMap((c) => wavebusCalls(c.text).map((call) => ({ ...call, where: c.where })));
  expect(calls.length).toBeGreaterThan(30);
  const top = spawnSync(process.execPath, [CLI, '--help'], { encoding: 'utf8' }).stdout;
  const subcommands = new Set([...top.matchAll(/^\s+wavebus (\w+)/gm)].map((m) => m[1]));
  expect(subcommands).toContain('keys');
  const benches = new Set([...spawnSync(process.execPath, [CLI, 'bench', '--help'], { encoding: 'utf8' }).stdout.matchAll(/^\s{2}(\w+)\s{2,}/gm)].map((m) => m[1]));
  expect(benches).toContain('overhead');
  const bad: string[] = [];
  const paths = [...new Set(calls.map((c) => c.command.join(' ')))];
  const helps = new Map<string, Set<string>>();
  // In parallel: each --help is one short node process.
  await Promise.all(
    paths.map(async (p) => {
      const argv = p.split(' ');
      if (!subcommands.has(argv[0]) || (argv[0] === 'bench' && argv[1] && !benches.has(argv[1]))) return;
      const { stdout } = await run(process.execPath, [CLI, ...argv, '--help'], { timeout: 60000 });
      helps.set(p, new Set(stdout.match(/(?<![\w-])--[a-z][a-z0-9-]*/g) ?? []));
    }),
  );
  for (const c of calls) {
    const p = c.command.join(' ');
    const known = helps.get(p);
    if (!known) {
      bad.push(`${c.where}: no such command: wavebus ${p}`);
      continue;
    }
    for (const f of c.flags) if (!known.has(f) && !known.has(f.replace(/^--no-/, '--'))) bad.push(`${c.where}: wavebus ${p} has no ${f}`);
  }
  expect(bad).toEqual([]);
});

test('every npm script and repository path a command names exists', () => {
  const scripts = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')).scripts as Record<string, string>;
  const bad: string[] = [];
  for (const c of commands) {
    const w = words(c.text);
    w.forEach((word, i) => {
      if (word === 'run' && w[i - 1] === 'npm' && !(w[i + 1] in scripts)) bad.push(`${c.where}: no npm script ${w[i + 1]}`);
      if (/^(\.\/)?(bin|scripts|launch|examples|clients)\/[\w./-]+$/.test(word) && !fs.existsSync(path.join(ROOT, word))) bad.push(`${c.where}: no file ${word}`);
    });
  }
  expect(bad).toEqual([]);
});

test('the commands that can run here run as written, each doc in a temp dir of its own, in the doc\'s order', () => {
  // `wavebus` is what the README's set-up puts on the PATH (`npm link` in the clone), nothing else.
  const setup = commands.find((c) => c.file === 'README.md')!;
  expect(words(setup.text)).toEqual(expect.arrayContaining(['npm', 'link']));
  const prefix = tmpDir('wavebus-doc-prefix-');
  const PATH = readerPath(ROOT, prefix, process.env.PATH ?? '');
  const found = spawnSync('bash', ['-c', 'command -v wavebus'], { env: { ...process.env, PATH }, encoding: 'utf8' }).stdout.trim();
  expect(found).toBe(path.join(prefix, 'bin', 'wavebus'));
  expect(fs.realpathSync(found)).toBe(fs.realpathSync(CLI)); // the clone's CLI, through npm's links
  const ran: string[] = [];
  const byFile = new Map<string, DocCommand[]>();
  for (const c of commands.filter((c) => c.text in RUNNABLE)) byFile.set(c.file, [...(byFile.get(c.file) ?? []), c]);
  for (const [, list] of byFile) {
    const dir = tmpDir('wavebus-doc-');
    const env = { ...process.env, HOME: dir, PATH };
    for (const c of list) {
      const spec = RUNNABLE[c.text];
      const cwd = spec.cwd === 'repo' ? ROOT : dir;
      if (spec.setup) expect(spawnSync('bash', ['-c', spec.setup], { cwd: dir, env, encoding: 'utf8' }).status).toBe(0);
      const r = spawnSync('bash', ['-c', c.text], { cwd, env, encoding: 'utf8', timeout: 60000 });
      expect([c.where, c.text, r.status, r.stderr]).toEqual([c.where, c.text, 0, expect.any(String)]);
      spec.check(dir, r.stdout);
      ran.push(c.where);
    }
  }
  expect(ran.length).toBeGreaterThanOrEqual(Object.keys(RUNNABLE).length);
});
