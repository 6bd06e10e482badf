"""A hostile local user's coordinator: binds the bus ports first and tries to make an agent read
/etc/shadow and write outside its dump root (test/roots-auth.test.ts). Commands on stdin:
`wave N DIR` publishes wave N with a dump job into DIR; `files` asks for /etc/shadow every way it
can. Prints one JSON line per event on stdout.

Usage: rogue_coordinator.py PB_DIR PORT [plain]
`plain`: the PUB speaks ZMTP PLAIN and admits any user and password (an agent with the bus token
subscribes with PLAIN; a squatter simply takes whatever it is given).
"""
import json
import sys
import time

sys.path.insert(0, sys.argv[1])
import wavebus_pb2 as pb  # noqa: E402
import zmq  # noqa: E402

port = int(sys.argv[2])
EPOCH = 777
PLAIN = len(sys.argv) > 3 and sys.argv[3] == "plain"
ctx = zmq.Context()
zap = None
if PLAIN:
    # A ZAP handler that admits everyone: libzmq's PLAIN server asks one for every handshake.
    zap = ctx.socket(zmq.ROUTER)
    zap.bind("inproc://zeromq.zap.01")
pub = ctx.socket(zmq.PUB)
if PLAIN:
    pub.plain_server = True
    pub.zap_domain = b"rogue"
pub.bind(f"tcp://127.0.0.1:{port}")
router = ctx.socket(zmq.ROUTER)
router.bind(f"tcp://127.0.0.1:{port + 1}")
seq = 0
peer = None
next_id = 100
# dump_root=/ in the config: the served root of a trusting agent would be the whole disk.
CONFIG = pb.AgentConfig(bus_active=True, dump_root="/", free_headroom_bytes=0, dump_format=pb.TENSOR_FORMAT_PT)


def say(**kw):
    print(json.dumps(kw), flush=True)


def publish(frame, topic):
    global seq
    seq += 1
    frame.epoch = EPOCH
    frame.seq = seq
    pub.send_multipart([topic, frame.SerializeToString()])


def heartbeat():
    f = pb.BusFrame()
    f.heartbeat.wave = 0
    f.heartbeat.unix_ms = int(time.time() * 1000)
    publish(f, b"r0.H")


def job(wave, d):
    return pb.DumpJob(incident_type="manual_trigger", req_id="r1", block_ids=[0], detect_wave=wave, arm_wave=wave, dump_dir=d, job_id=f"{wave}/manual_trigger/r1")


def ask(**body):
    global next_id
    next_id += 1
    m = pb.CoordinatorMessage(epoch=EPOCH, request_id=next_id)
    for k, v in body.items():
        getattr(m, k).CopyFrom(v)
    router.send_multipart([peer, m.SerializeToString()])


say(event="bound")
poller = zmq.Poller()
poller.register(router, zmq.POLLIN)
if zap is not None:
    poller.register(zap, zmq.POLLIN)
poller.register(sys.stdin, zmq.POLLIN)
last_hb = 0.0
while True:
    if time.time() - last_hb > 0.1:
        heartbeat()
        last_hb = time.time()
    for sock, _ in poller.poll(50):
        if sock is zap:
            # [routing id, empty, version, request id, domain, address, identity, mechanism, user, password]
            req = zap.recv_multipart()
            say(event="plain_hello", user=req[8].decode("latin1") if len(req) > 8 else "")
            zap.send_multipart([req[0], b"", b"1.0", req[3], b"200", b"OK", b"", b""])
        elif sock is router:
            parts = router.recv_multipart()
            peer = parts[0]
            m = pb.AgentMessage()
            try:
                m.ParseFromString(parts[1])
            except Exception as e:  # noqa: BLE001
                say(event="garbage", error=str(e))
                continue
            body = m.WhichOneof("body")
            if body == "snapshot":
                r = pb.CoordinatorMessage(epoch=EPOCH, request_id=m.request_id)
                r.snapshot.epoch = EPOCH
                r.snapshot.seq = seq
                r.snapshot.config.CopyFrom(CONFIG)
                r.snapshot.protocol_version = pb.PROTOCOL_VERSION_CURRENT  # a squatter speaking the current protocol
                r.snapshot.decide_ahead = 1
                r.snapshot.pending.add(wave=seq + 1000, jobs=[job(seq + 1000, "/")])
                router.send_multipart([peer, r.SerializeToString()])
                say(event="snapshot_sent")
            elif body in ("file_list", "file_chunk"):
                inner = getattr(m, body)
                say(event=body, error=inner.error, frames=len(parts) - 1, data=b"".join(parts[2:]).hex() + inner.data.hex() if body == "file_chunk" else "",
                    files=[f.path for f in inner.files] if body == "file_list" else [])
            elif body == "dump_result":
                say(event="dump_result", rank=m.dump_result.global_rank, error=m.dump_result.error, files=len(m.dump_result.files))
            else:
                say(event=body)
        else:
            line = sys.stdin.readline()
            if not line:
                sys.exit(0)
            cmd = line.split()
            if cmd[0] == "wave":
                w = int(cmd[1])
                f = pb.BusFrame()
                f.head.wave = w
                f.head.dump_due = True
                publish(f, b"r0.W")
                f = pb.BusFrame()
                f.dump.wave = w
                f.dump.jobs.append(job(w, cmd[2]))
                publish(f, b"r0.D")
                say(event="wave_sent", wave=w)
            elif cmd[0] == "files" and peer is not None:
                for root in ("dumps", "snapshots"):
                    for p in ("etc/shadow", "/etc/shadow", "../../../../../../etc/shadow", "../" * 12 + "etc/shadow"):
                        ask(file_chunk=pb.FileChunkRequest(root=root, path=p, offset=0, length=65536))
                    ask(file_list=pb.FileListRequest(root=root, prefix="../../../../../../etc"))
                    ask(file_list=pb.FileListRequest(root=root, prefix=""))
                say(event="files_asked")
