// The device a replay ran on, as the replay process saw it (<save-logits>/fingerprint.json, written
// by the replayer: wavebus_client.fingerprint.device_fingerprint): the host's name, the torch build,
// and the CPU (model, microcode, flags digest) or the CUDA device (name, UUID, driver). A
// device-local verdict names the same-host replay's devices with it (docs/verdict.md). The file is
// the replayer's output: read bounded, every field checked, anything else dropped.
import * as fs from 'fs';
import * as path from 'path';

export type DeviceFingerprint = Record<string, string | number>;

const MAX_BYTES = 64 * 1024;
const MAX_DEVICES = 64;
const KEY = /^[a-z_]{1,32}$/;

/** The devices of `dir`/fingerprint.json, or a reason it could not be read (never throws). */
export function readReplayFingerprint(dir: string): { devices: DeviceFingerprint[] } | { error: string } {
  const file = path.join(dir, 'fingerprint.json');
  let doc: any;
  try {
    const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
    try {
      const size = fs.fstatSync(fd).size;
      if (size > MAX_BYTES) return { error: `${file}: ${size} bytes (at most ${MAX_BYTES})` };
      const buf = Buffer.alloc(size);
      fs.readSync(fd, buf, 0, size, 0);
      doc = JSON.parse(buf.toString('utf8'));
    } finally {
      fs.closeSync(fd);
    }
  } catch (e) {
    return { error: `${file}: ${(e as Error).message}` };
  }
  if (!doc || !Array.isArray(doc.devices)) return { error: `${file}: expected {"devices": [...]}` };
  return { devices: doc.devices.slice(0, MAX_DEVICES).filter((d: unknown) => d && typeof d === 'object').map(clean) };
}

function clean(d: Record<string, unknown>): DeviceFingerprint {
  const out: DeviceFingerprint = {};
  for (const [k, v] of Object.entries(d).slice(0, 32)) {
    if (!KEY.test(k)) continue;
    if (typeof v === 'string') out[k] = v.slice(0, 256);
    else if (typeof v === 'number' && Number.isSafeInteger(v)) out[k] = v;
  }
  return out;
}

/** One line per device: "hostname vm, cpu AMD EPYC, microcode 0x1000065, 106 flags, sha256 ..., torch 2.1". */
export function describeDevice(d: DeviceFingerprint): string {
  const parts = [`hostname ${d.hostname ?? '?'}`];
  if (d.kind === 'cuda') parts.push(`cuda:${d.index} ${d.device_name ?? '?'}`, `uuid ${d.device_uuid || '?'}`, `driver ${d.cuda_driver ?? '?'}`, `runtime ${d.cuda_runtime ?? '?'}`);
  else parts.push(`cpu ${d.cpu_model ?? '?'}`, `microcode ${d.cpu_microcode ?? '?'}`, `${d.cpu_flags ?? 'flags ?'}`);
  if (d.torch) parts.push(`torch ${d.torch}`);
  return parts.join(', ');
}
