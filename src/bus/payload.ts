// Bulk bytes that travel beside a protobuf message as its own ZeroMQ frame: a file chunk's data.
// The protobuf header stays small, and a relay (the coordinator) forwards the frame as it
// arrived, without decoding or copying it: zeromq.js receives large frames into external
// Buffers and sends Buffers zero-copy. A Buffer handed over this way must not be written to
// afterwards (libzmq may still be sending it).

/** The key under which a message body (or a decoded message) carries its payload frame. */
export const PAYLOAD: unique symbol = Symbol('wavebus.payload');

export type WithPayload<T> = T & { [PAYLOAD]?: Buffer };

/** `body` with `data` attached as its payload frame. */
export function withPayload<T extends object>(body: T, data: Buffer): WithPayload<T> {
  return Object.assign(body, { [PAYLOAD]: data });
}

/** The payload frame attached to `msg`, if any. */
export function payloadOf(msg: object): Buffer | undefined {
  return (msg as { [PAYLOAD]?: Buffer })[PAYLOAD];
}
