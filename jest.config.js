/** Tests run against the TypeScript sources; spawned CLI processes use dist/, which `npm test`'s pretest rebuilds first. */
// Quiet logs by default (tests that read log lines set WAVEBUS_LOG_LEVEL themselves); children inherit it.
process.env.WAVEBUS_LOG_LEVEL = process.env.WAVEBUS_LOG_LEVEL || 'warn';

module.exports = {
  preset: 'ts-jest',
  testEnvironment: 'node',
  testMatch: ['<rootDir>/test/**/*.test.ts'],
  testTimeout: 60000,
  transform: { '^.+\\.ts$': ['ts-jest', { tsconfig: { strict: true, esModuleInterop: true, target: 'ES2022', module: 'commonjs', skipLibCheck: true } , diagnostics: { warnOnly: false } }] },
};
