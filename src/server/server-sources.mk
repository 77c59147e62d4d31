# pdio's own NBD server's sources, listed once.  Included by
# src/Makefile.am (libpdioserver) and tests/Makefile.am (the sanitizer
# builds and the fuzzer, which takes only the pure wire format and
# handshake); %reldir% is this directory as seen from the includer.
SERVER_PROTO_C = %reldir%/proto.c %reldir%/handshake.c
SERVER_C = $(SERVER_PROTO_C) \
	%reldir%/conn.c %reldir%/worker.c %reldir%/server.c
SERVER_H = %reldir%/proto.h %reldir%/handshake.h %reldir%/server.h \
	%reldir%/internal.h
SERVER_SRCS = $(SERVER_C) $(SERVER_H)
