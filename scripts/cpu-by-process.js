// Preloaded into every node process of a job (NODE_OPTIONS="--require <this file>"): at exit,
// appends one JSON line to $WAVEBUS_CPU_BY_PROCESS (a file path) with the process's command
// (`wavebus <cmd>`) and its threads' CPU by name (the main thread, V8's workers "node",
// ZeroMQ's I/O thread "ZMQbg/IO/0"), from /proc. docs/benchmarks.md, "Where a wave's time goes".
'use strict';
const fs = require('fs');

const out = process.env.WAVEBUS_CPU_BY_PROCESS;
if (out) {
  process.on('exit', () => {
    const threads = {};
    for (const tid of fs.readdirSync('/proc/self/task')) {
      try {
        const stat = fs.readFileSync(`/proc/self/task/${tid}/stat`, 'utf8');
        const name = tid === String(process.pid) ? 'main' : stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
        const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
        // utime + stime in clock ticks (USER_HZ, 100 on Linux): µs.
        threads[name] = (threads[name] || 0) + (Number(f[11]) + Number(f[12])) * 10000;
      } catch {
        /* the thread ended meanwhile */
      }
    }
    const cmd = process.argv.slice(1).find((a) => !a.startsWith('-') && !a.endsWith('.js')) || process.argv[1] || '';
    fs.appendFileSync(out, `${JSON.stringify({ pid: process.pid, cmd, threads })}\n`);
  });
}
