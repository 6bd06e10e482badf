/* What a system call and a wake-up cost on this host: the unit prices behind every bus hop
 * (docs/benchmarks.md, "Where a wave's time goes"). Built and run by host-costs.sh.
 *   syscall_us      getppid(), a system call that does no work, in a loop
 *   clock_us        clock_gettime(CLOCK_MONOTONIC) (vDSO: no system call when the clock allows)
 *   round_trip_us   one byte to another process over a pipe and back (two wake-ups)
 *   round_trip_cpu_us  this process's CPU (user + system) per round trip */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static double cpu_us(void) {
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  return r.ru_utime.tv_sec * 1e6 + r.ru_utime.tv_usec + r.ru_stime.tv_sec * 1e6 + r.ru_stime.tv_usec;
}

int main(void) {
  const int calls = 200000, trips = 20000;
  double t0 = now_us();
  for (int i = 0; i < calls; i++) (void)getppid();
  double syscall_us = (now_us() - t0) / calls;
  struct timespec ts;
  t0 = now_us();
  for (int i = 0; i < calls; i++) clock_gettime(CLOCK_MONOTONIC, &ts);
  double clock_us = (now_us() - t0) / calls;

  int to[2], back[2];
  if (pipe(to) || pipe(back)) return perror("pipe"), 1;
  pid_t peer = fork();
  if (peer < 0) return perror("fork"), 1;
  char c = 'x';
  if (peer == 0) {
    close(to[1]);
    while (read(to[0], &c, 1) == 1)
      if (write(back[1], &c, 1) != 1) _exit(1);
    _exit(0);
  }
  close(to[0]);
  double c0 = cpu_us();
  t0 = now_us();
  for (int i = 0; i < trips; i++)
    if (write(to[1], &c, 1) != 1 || read(back[0], &c, 1) != 1) return perror("pipe round trip"), 1;
  double rt = (now_us() - t0) / trips, rt_cpu = (cpu_us() - c0) / trips;
  close(to[1]);
  waitpid(peer, NULL, 0);
  printf("{\"syscall_us\":%.3f,\"clock_us\":%.3f,\"round_trip_us\":%.2f,\"round_trip_cpu_us\":%.2f}\n", syscall_us, clock_us, rt, rt_cpu);
  return 0;
}
