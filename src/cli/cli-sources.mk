# pdio(1)'s sources, listed once.  Included by src/cli/Makefile.am (the
# program) and tests/Makefile.am (its ASan and TSan builds); %reldir% is
# this directory as seen from the including Makefile.am.
PDIO_CLI_C = \
	%reldir%/main.c %reldir%/attach.c %reldir%/detach.c %reldir%/list.c \
	%reldir%/serve.c %reldir%/serve_native.c %reldir%/server.c \
	%reldir%/state.c %reldir%/nbd_dev.c %reldir%/spawn.c %reldir%/util.c \
	%reldir%/nbd_handshake.c %reldir%/nbd_netlink.c %reldir%/device.c \
	%reldir%/frontend.c %reldir%/supervise.c %reldir%/restart.c \
	%reldir%/mount_pdio.c %reldir%/umount_pdio.c
PDIO_CLI_H = %reldir%/pdio.h %reldir%/kernel.h
PDIO_CLI_SRCS = $(PDIO_CLI_C) $(PDIO_CLI_H)
