# SPDX-License-Identifier: BSD-3-Clause
# Every source of the product, listed once by part.  Included by
# src/Makefile.am (the libraries and pdio(1)) and tests/Makefile.am (the
# sanitizer builds that compile the parts in, and the fuzzers); %reldir%
# is src/ as seen from the including Makefile.am.

# What every part uses: byte order, rounding, powers of two, the page
# size, container_of, valgrind's client requests.  Headers only, each
# with its test in tests/common/.
COMMON_H = \
	%reldir%/common/byteorder.h %reldir%/common/container_of.h \
	%reldir%/common/ispowerof2.h %reldir%/common/pagesize.h \
	%reldir%/common/rounding.h %reldir%/common/vg.h

# The engine: the asynchronous O_DIRECT library.  No nbdkit headers.
ENGINE_C = \
	%reldir%/engine/engine.c %reldir%/engine/open.c \
	%reldir%/engine/geometry.c %reldir%/engine/dio_args.c \
	%reldir%/engine/plan.c %reldir%/engine/range_lock.c \
	%reldir%/engine/pool.c %reldir%/engine/io.c %reldir%/engine/thread.c \
	%reldir%/engine/req.c %reldir%/engine/sync.c \
	%reldir%/engine/backend_uring.c %reldir%/engine/backend_psync.c \
	%reldir%/engine/zero.c %reldir%/engine/extents.c \
	%reldir%/engine/helper.c
ENGINE_H = \
	%reldir%/engine/include/engine.h %reldir%/engine/engine_internal.h \
	%reldir%/engine/geometry.h %reldir%/engine/dio_args.h \
	%reldir%/engine/plan.h %reldir%/engine/range_lock.h \
	%reldir%/engine/pool.h %reldir%/engine/io.h %reldir%/engine/req.h
ENGINE_SOURCES = $(ENGINE_C) $(ENGINE_H)

# The NBD wire format, shared by the server and pdio(1)'s client
# handshake: the codec of each phase's messages and the spec's rules;
# pure, the fuzzers drive it.
PROTOCOL_C = %reldir%/protocol/handshake_wire.c \
	%reldir%/protocol/transmission_wire.c %reldir%/protocol/proto.c
# kTLS's hand-off of a GnuTLS session to the socket: not pure, so not in
# PROTOCOL_C (the fuzzers' set).
PROTOCOL_KTLS_C = %reldir%/protocol/ktls.c
# The loading of GnuTLS (dlopen) for pdio serve's and the client's TLS.
PROTOCOL_GNUTLS_C = %reldir%/protocol/gnutls.c
PROTOCOL_SRCS = $(PROTOCOL_C) $(PROTOCOL_KTLS_C) $(PROTOCOL_GNUTLS_C) \
	%reldir%/protocol/include/proto.h

# pdio's own NBD server.  The handshake is pure too (fuzzed with the
# protocol); the connections and workers run on the engine's rings.
SERVER_HANDSHAKE_C = %reldir%/server/handshake.c
SERVER_C = $(SERVER_HANDSHAKE_C) \
	%reldir%/server/conn.c %reldir%/server/cmd.c %reldir%/server/worker.c \
	%reldir%/server/server.c %reldir%/server/handover.c \
	%reldir%/server/tls.c %reldir%/server/devstats.c
SERVER_H = %reldir%/server/handshake.h %reldir%/server/include/server.h \
	%reldir%/server/internal.h %reldir%/server/cmd.h \
	%reldir%/server/handover.h %reldir%/server/tls.h
SERVER_SRCS = $(SERVER_C) $(SERVER_H)

# pdio(1): attach, detach, list, serve, restart, resize, mount.pdio,
# umount.pdio.  json.c is pure (tests/cli/test_json compiles it alone),
# and so is watchdog.c (tests/cli/test_watchdog); negotiate.c needs only
# a socket (tests/cli/test_negotiate); wait.c needs only spawn.c and
# util.c (tests/cli/test_wait); uri.c and link_policy.c are pure
# (tests/cli/test_uri and its fuzzer, tests/cli/test_link).
CLI_WAIT_C = %reldir%/cli/wait.c %reldir%/cli/spawn.c %reldir%/cli/util.c
CLI_JSON_C = %reldir%/cli/json.c
CLI_WATCHDOG_C = %reldir%/cli/watchdog.c
CLI_NEGOTIATE_C = %reldir%/cli/negotiate.c
CLI_URI_C = %reldir%/cli/uri.c
CLI_LINK_POLICY_C = %reldir%/cli/link_policy.c
# nbds://: the client's TLS (GnuTLS, loaded when asked for) and the relay
# that carries it where kTLS cannot; tests/cli/test_relay drives both.
CLI_TLS_C = %reldir%/cli/tls_client.c %reldir%/cli/relay.c
CLI_C = $(CLI_JSON_C) $(CLI_WATCHDOG_C) $(CLI_NEGOTIATE_C) $(CLI_WAIT_C) \
	$(CLI_URI_C) $(CLI_LINK_POLICY_C) \
	%reldir%/cli/main.c %reldir%/cli/attach.c %reldir%/cli/detach.c \
	%reldir%/cli/list.c %reldir%/cli/serve.c %reldir%/cli/serve_native.c \
	%reldir%/cli/stats.c \
	%reldir%/cli/restart.c %reldir%/cli/resize.c %reldir%/cli/mount_pdio.c \
	%reldir%/cli/umount_pdio.c %reldir%/cli/supervise.c \
	%reldir%/cli/announce.c %reldir%/cli/daemon.c \
	%reldir%/cli/server_cmd.c %reldir%/cli/device.c \
	%reldir%/cli/nbd_netlink.c %reldir%/cli/sysfs.c %reldir%/cli/state.c \
	%reldir%/cli/claim.c %reldir%/cli/attachments.c \
	%reldir%/cli/procmem.c %reldir%/cli/proctask.c %reldir%/cli/systemd.c \
	%reldir%/cli/placement.c %reldir%/cli/protect.c %reldir%/cli/pressure.c \
	%reldir%/cli/remote.c %reldir%/cli/link.c $(CLI_TLS_C)
CLI_SRCS = $(CLI_C) %reldir%/cli/pdio.h
