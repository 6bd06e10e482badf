// The client <-> agent protocol version and the enum numbers of the client's messages, read from
// proto/wavebus.proto (the Python client reads the same enums from its generated module).
import { ProtocolError } from '../errors';
import { enumValues } from '../proto';

// One version for the whole wire protocol (enum ProtocolVersion): the bus's hellos carry the same.
const protocol = enumValues('ProtocolVersion');
const kinds = enumValues('RegionKind');
const roles = enumValues('RegionRole');

/** The client <-> agent protocol version this build speaks (ProtocolVersion.PROTOCOL_VERSION_CURRENT). */
export const CLIENT_PROTOCOL_VERSION: number = protocol.PROTOCOL_VERSION_CURRENT;

/** Largest message either side of the client <-> agent socket takes (its maxMessageSize; enum ClientSocketLimit). */
export const CLIENT_SOCKET_MAX_MESSAGE_BYTES: number = enumValues('ClientSocketLimit').CLIENT_SOCKET_MAX_MESSAGE_BYTES;

export const RegionKind = { SHM: kinds.REGION_SHM, CUDA: kinds.REGION_CUDA } as const;
export const RegionRole = { KV_POOL: roles.ROLE_KV_POOL, INPUT: roles.ROLE_INPUT, WEIGHT: roles.ROLE_WEIGHT } as const;

function describe(v: number): string {
  return v === protocol.PROTOCOL_VERSION_UNSPECIFIED ? `${v} (from before protocol versions)` : String(v);
}

/**
 * Undefined when `peer` speaks this build's version; else the refusal, naming both versions and the
 * side to upgrade (the older one). `self` is the side checking: 'agent' checks a client's hello,
 * 'client' checks the agent's reply.
 */
export function protocolMismatch(self: 'agent' | 'client', peer: number, where: string): ProtocolError | undefined {
  if (peer === CLIENT_PROTOCOL_VERSION) return undefined;
  const other = self === 'agent' ? 'client' : 'agent';
  const older = peer < CLIENT_PROTOCOL_VERSION ? other : self;
  const fix = older === 'client' ? 'upgrade the engine client (wavebus / wavebus_client)' : 'upgrade wavebus on this host (the agent)';
  return new ProtocolError(
    `${where}: client protocol mismatch: the ${other} speaks version ${describe(peer)}, this ${self} speaks version ${describe(CLIENT_PROTOCOL_VERSION)}; ${fix} so both speak the same version`,
    'ERR_PROTOCOL_VERSION',
  );
}
