/* SPDX-License-Identifier: BSD-3-Clause */
/* ThreadSanitizer options baked into the TSan test programs, so that
 * `make check` needs no TSAN_OPTIONS in its environment: stop at the
 * first report (halt_on_error=1) with a distinctive exit code, so no
 * report can scroll past in a passing log.  TSAN_OPTIONS, if set, still
 * adds to or overrides these.
 */
const char *__tsan_default_options (void);

const char *
__tsan_default_options (void)
{
  return "halt_on_error=1 exitcode=66 second_deadlock_stack=1";
}
