/* On a fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT), writes the signal, the faulting address
 * and a backtrace to stderr, each frame as "file+offset" from /proc/self/maps so it can be resolved
 * offline (addr2line -e FILE OFFSET), then dies of the same signal. Install once, early in main. */
#ifndef SERVD_CRASH_REPORT_H
#define SERVD_CRASH_REPORT_H

void servd_crash_report_install(void);
/* Gives the calling thread an alternate signal stack, so a stack overflow is reported too. */
void servd_crash_report_thread(void);

#endif
