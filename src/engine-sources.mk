# The engine's sources, listed once.  Included by src/Makefile.am (the
# library) and tests/Makefile.am (the sanitizer builds that compile the
# engine in, and the fuzzer); %reldir% is this directory as seen from the
# including Makefile.am.
ENGINE_C = \
	%reldir%/engine.c %reldir%/open.c %reldir%/geometry.c \
	%reldir%/dio_args.c %reldir%/plan.c %reldir%/range_lock.c \
	%reldir%/pool.c %reldir%/io.c %reldir%/ring.c %reldir%/req.c \
	%reldir%/sync.c %reldir%/backend_uring.c %reldir%/backend_psync.c \
	%reldir%/zero.c %reldir%/extents.c
ENGINE_H = \
	%reldir%/engine.h %reldir%/engine_internal.h %reldir%/geometry.h \
	%reldir%/dio_args.h %reldir%/plan.h %reldir%/range_lock.h \
	%reldir%/pool.h %reldir%/io.h %reldir%/req.h %reldir%/vg.h
ENGINE_SOURCES = $(ENGINE_C) $(ENGINE_H)
