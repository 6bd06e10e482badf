// The whole native surface of wavebus, declared in one place. Everything else imports from here.
// Arguments are validated in TypeScript before these are called; C++ only moves bytes.
import * as path from 'path';

export interface NativeBinding {
  abiVersion: number;
}

function load(): NativeBinding {
  const root = path.resolve(__dirname, '..');
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  return require(path.join(root, 'build', 'Release', 'wavebus_native.node')) as NativeBinding;
}

export const native: NativeBinding = load();
