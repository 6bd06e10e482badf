// The bus token: without CURVE, the coordinator and the agents its launcher started prove to each
// other that they belong to the same job. The launcher writes 32 random bytes (hex) to a 0600
// file in its run directory (or --bus-token-dir), reads it back once and hands its coordinator and
// agents the value on a pipe (--bus-token-fd): a restarted coordinator never reads a path again.
// The engine and the tools get the file's path (WAVEBUS_BUS_TOKEN_FILE), never the value.
// Every message on the bus then ends in a `mac` field (field 15 of BusFrame, AgentMessage and
// CoordinatorMessage): HMAC-SHA256, keyed by the token, over a direction label, the message bytes
// before the field, and the data frame that follows a file chunk. A receiver with the token
// drops what has no MAC or a wrong one before decoding anything.
import { createHmac, timingSafeEqual } from 'crypto';
import * as path from 'path';
import { ConfigError } from '../errors';
import { createSecretFile, readSecretFd, readSecretFile, secretText, SECRET_BYTES } from '../artifacts/secret-file';

/** The token's bytes. */
export const TOKEN_BYTES = SECRET_BYTES;
export const MAC_BYTES = 32;
/** The file name the launcher gives the token in its run directory. */
export const TOKEN_FILE_NAME = 'bus.token';
/** Field 15, wire type 2 (length-delimited), then the length 32: the MAC field's first two bytes. */
const MAC_TAG = (15 << 3) | 2;
/** What seal() appends: field 15's tag, its length and the MAC. */
export const TRAILER_BYTES = 2 + MAC_BYTES;

/**
 * Who sent a message, bound into its MAC, so that bytes sent one way can never be replayed the
 * other way (an agent's message reflected back to it as a coordinator's).
 */
export type MacDirection = 'pub' | 'from-coordinator' | 'to-coordinator';
const LABEL: Record<MacDirection, Buffer> = {
  pub: Buffer.from('wavebus bus frame v1\0'),
  'from-coordinator': Buffer.from('wavebus coordinator message v1\0'),
  'to-coordinator': Buffer.from('wavebus agent message v1\0'),
};
/** What the PUB's subscriber credential is derived from (subscriberPassword). */
const SUBSCRIBER_LABEL = Buffer.from('wavebus subscriber v1\0');

/**
 * The ZMTP PLAIN user name a subscriber gives the coordinator's PUB on a bus with the token and
 * without CURVE (server-sockets.ts): libzmq keeps every subscription a connected peer sends in a
 * topic trie with no limit, so only peers that hold the token may connect at all.
 */
export const SUBSCRIBER_USER = 'wavebus-subscriber';

export type Opened = { ok: true; msg: Buffer } | { ok: false; reason: 'no_mac' | 'bad_mac' };

export class BusToken {
  private constructor(private readonly key: Buffer) {}

  static fromBytes(key: Buffer): BusToken {
    if (key.length !== TOKEN_BYTES) throw new ConfigError(`bus token: expected ${TOKEN_BYTES} bytes, got ${key.length}`);
    return new BusToken(Buffer.from(key));
  }

  /**
   * Read a token file: a regular file (not a link), readable by nobody else, holding 64 hex
   * digits (and an optional newline). `flag` names where the path came from, for errors.
   */
  static load(file: string, flag: string): BusToken {
    return new BusToken(readSecretFile(file, flag, 'the bus token'));
  }

  /** The token as `--bus-token-fd` reads it, for a child this process starts (verdict.auto's CLI): on a pipe only, never an argument or a file. */
  pipeText(): string {
    return secretText(this.key);
  }

  /** The MAC of `msg` (and `data`, a chunk's frame) sent in `dir`. */
  mac(dir: MacDirection, msg: Uint8Array, data?: Uint8Array, topic?: Uint8Array): Buffer {
    const h = createHmac('sha256', this.key).update(LABEL[dir]);
    // Lengths first: the parts' boundaries are part of what is authenticated.
    const lens = Buffer.alloc(12);
    lens.writeUInt32LE(topic?.length ?? 0, 0);
    lens.writeUInt32LE(msg.length, 4);
    lens.writeUInt32LE(data?.length ?? 0, 8);
    h.update(lens);
    if (topic) h.update(topic);
    h.update(msg);
    if (data) h.update(data);
    return h.digest();
  }

  /** `msg` with its MAC appended as field 15 (a protobuf reader sees one more bytes field). */
  seal(dir: MacDirection, msg: Uint8Array, data?: Uint8Array, topic?: Uint8Array): Buffer {
    const out = Buffer.allocUnsafe(msg.length + TRAILER_BYTES);
    out.set(msg, 0);
    out[msg.length] = MAC_TAG;
    out[msg.length + 1] = MAC_BYTES;
    this.mac(dir, msg, data, topic).copy(out, msg.length + 2);
    return out;
  }

  /**
   * seal() in place: `buf` holds the message in its first `msgLen` bytes and TRAILER_BYTES of room
   * after them (the agent's relayed wave head is built so: no copy of its columns here).
   */
  sealInPlace(dir: MacDirection, buf: Buffer, msgLen: number): Buffer {
    if (buf.length !== msgLen + TRAILER_BYTES) throw new RangeError(`sealInPlace: ${buf.length} bytes, expected ${msgLen} + ${TRAILER_BYTES}`);
    buf[msgLen] = MAC_TAG;
    buf[msgLen + 1] = MAC_BYTES;
    this.mac(dir, buf.subarray(0, msgLen)).copy(buf, msgLen + 2);
    return buf;
  }

  /**
   * The PLAIN password of a subscriber (SUBSCRIBER_USER): derived from the token, never the token
   * itself, since PLAIN sends it in clear; it admits a subscription and proves nothing else.
   */
  subscriberPassword(): string {
    return createHmac('sha256', this.key).update(SUBSCRIBER_LABEL).digest('hex');
  }

  /** The message without its MAC field, when the MAC is there and right. */
  open(dir: MacDirection, bytes: Buffer, data?: Uint8Array, topic?: Uint8Array): Opened {
    const n = bytes.length - TRAILER_BYTES;
    if (n < 0 || bytes[n] !== MAC_TAG || bytes[n + 1] !== MAC_BYTES) return { ok: false, reason: 'no_mac' };
    const msg = bytes.subarray(0, n);
    const want = this.mac(dir, msg, data, topic);
    if (!timingSafeEqual(want, bytes.subarray(n + 2))) return { ok: false, reason: 'bad_mac' };
    return { ok: true, msg };
  }
}

/**
 * Create a fresh token file in `dir` (the launcher's run directory): created exclusively, never
 * through a link, mode 0600 whatever the umask. Returns its path.
 */
export function createTokenFile(dir: string): string {
  return createSecretFile(path.join(dir, TOKEN_FILE_NAME), 'the bus token');
}

/** The descriptor a launcher's sidecar reads its token from (sidecar.ts: the pipe after stderr). */
export const TOKEN_FD = 3;

/**
 * --bus-token-fd (a pipe from the launcher), else --bus-token-file, else $WAVEBUS_BUS_TOKEN_FILE (a
 * path, never the token itself), else none.
 */
export function loadBusToken(flagValue: unknown, env: NodeJS.ProcessEnv, fdValue?: unknown): BusToken | undefined {
  if (fdValue !== undefined && fdValue !== '') {
    const fd = Number(fdValue);
    if (!Number.isSafeInteger(fd) || fd < 3) throw new ConfigError(`--bus-token-fd ${JSON.stringify(fdValue)}: expected a descriptor number of 3 or more (a pipe from \`wavebus launch\`)`);
    return BusToken.fromBytes(readSecretFd(fd, '--bus-token-fd'));
  }
  if (flagValue !== undefined && flagValue !== '') return BusToken.load(String(flagValue), '--bus-token-file');
  if (env.WAVEBUS_BUS_TOKEN_FILE) return BusToken.load(env.WAVEBUS_BUS_TOKEN_FILE, 'WAVEBUS_BUS_TOKEN_FILE');
  return undefined;
}

/**
 * A subscriber's socket options (the agents' SUB) on a bus with the token and without CURVE: PLAIN
 * with the derived password, which the coordinator's PUB checks (server-sockets.ts). With CURVE,
 * CURVE alone (its keys admit the peer); without either, none.
 */
export function subscriberSocketOptions(token: BusToken | undefined, curve: boolean): Record<string, unknown> {
  return token && !curve ? { plainUsername: SUBSCRIBER_USER, plainPassword: token.subscriberPassword() } : {};
}
