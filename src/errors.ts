// Named error classes. Each carries a stable code so callers and tests can branch on it.
// The codes themselves live in proto/errors.json, the one list shared with C++ and Python
// (docs/errors.md explains each; test/error-codes.test.ts holds every language to it).
import errorList from '../proto/errors.json';

export interface ErrorCodeInfo {
  readonly raisedBy: string;
  readonly meaning: string;
  readonly action: string;
}

/** Every listed code with what it means, who raises it and what the user does. */
export const ERROR_CODES: Readonly<Record<string, ErrorCodeInfo>> = errorList.codes;

const ERRNO_CODE = new RegExp(errorList.errnoFamily.pattern);

/** True for a code on the list, or a system-call failure (ERR_ + errno name, e.g. ERR_ENOSPC). */
export function isErrorCode(code: string): boolean {
  return Object.prototype.hasOwnProperty.call(ERROR_CODES, code) || ERRNO_CODE.test(code);
}

export class WavebusError extends Error {
  readonly code: string;
  constructor(code: string, message: string) {
    super(message);
    this.name = new.target.name;
    this.code = code;
  }
}

/** Bad configuration: flags, environment variables, config files. The message names the field. */
export class ConfigError extends WavebusError {
  constructor(message: string, code = 'ERR_CONFIG') {
    super(code, message);
  }
}

/** A frame or message that could not be accepted (decoding, epoch, size). */
export class ProtocolError extends WavebusError {
  constructor(message: string, code = 'ERR_PROTOCOL') {
    super(code, message);
  }
}

/** A capture or dump that could not be completed; nothing under a final name was left behind. */
export class CaptureError extends WavebusError {
  constructor(message: string, code = 'ERR_CAPTURE') {
    super(code, message);
  }
}

/** A control request (`wavebus status / dump / capture`) the coordinator refused, or that could not reach it. */
export class ControlError extends WavebusError {
  constructor(message: string, code = 'ERR_CONTROL') {
    super(code, message);
  }
}

/** Native memory access failures (region gone, short copy, backend unavailable). */
export class NativeError extends WavebusError {
  constructor(message: string, code = 'ERR_NATIVE') {
    super(code, message);
  }
}

/** A path refused because opening it would follow a link or reach something that is not a regular file or directory. */
export class UnsafePathError extends WavebusError {
  constructor(message: string, code = 'ERR_UNSAFE_PATH') {
    super(code, message);
  }
}

/** A path whose component another user owns or may write (a dump root, report dir or config file in a shared directory). */
export class UntrustedPathError extends WavebusError {
  constructor(message: string) {
    super('ERR_PATH_UNTRUSTED', message);
  }
}

/** A KV dump rank directory name that is neither the seed's dp<d>_tp<t>_pp<p>_cp<c> nor an older rank<g>. */
export class KvDirNameError extends WavebusError {
  constructor(message: string) {
    super('ERR_KV_DIR_NAME', message);
  }
}

/** `wavebus aggregate` could not gather what it was asked for (a refused or unreachable source, a bad listing). */
export class AggregateError extends WavebusError {
  constructor(message: string, code = 'ERR_AGGREGATE') {
    super(code, message);
  }
}

/** A root sent over the bus that is not the agent's local root or below it. */
export class RootRefusedError extends WavebusError {
  constructor(message: string) {
    super('ERR_ROOT_REFUSED', message);
  }
}

/** An input of `wavebus compare` that cannot be read as tensors (names the file). */
export class CompareInputError extends CaptureError {
  constructor(message: string) {
    super(message, 'ERR_COMPARE_INPUT');
  }
}

/** A JSONC text that could not be parsed; `line`/`column` are 1-based, in the original text. */
export class JsoncError extends ConfigError {
  readonly line: number;
  readonly column: number;
  constructor(source: string, line: number, column: number, reason: string) {
    super(`${source}:${line}:${column}: ${reason}`, 'ERR_CONFIG_JSONC');
    this.line = line;
    this.column = column;
  }
}

/** Malformed artifact: message names the file and where in it. */
export class ArtifactFormatError extends CaptureError {
  constructor(message: string) {
    super(message, 'ERR_ARTIFACT_FORMAT');
  }
}

/** A startup or runtime failure of the launched job (not a usage error). */
export class LaunchError extends WavebusError {
  constructor(message: string, code = 'ERR_LAUNCH_FAILED') {
    super(code, message);
  }
}

/** `wavebus verdict` was asked something it cannot answer from this tree and these flags (names which). */
export class VerdictError extends WavebusError {
  constructor(message: string) {
    super('ERR_VERDICT', message);
  }
}
