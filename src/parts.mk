# SPDX-License-Identifier: BSD-3-Clause
# What each part may include: its own folder, src/common, and the public
# headers of the parts below it (common < engine < protocol < server <
# cli; the plugin uses the engine).  Included by src/Makefile.am,
# plugin/Makefile.am and tests/Makefile.am; tests/common/layering.sh
# compiles with these very flags to prove that a part cannot reach
# another's internal headers.
COMMON_CPPFLAGS = -I$(top_builddir) -I$(top_srcdir)/src/common
ENGINE_PUBLIC = -I$(top_srcdir)/src/engine/include
PROTOCOL_PUBLIC = -I$(top_srcdir)/src/protocol/include
SERVER_PUBLIC = -I$(top_srcdir)/src/server/include
ENGINE_PART_CPPFLAGS = $(COMMON_CPPFLAGS) $(ENGINE_PUBLIC) \
	-I$(top_srcdir)/src/engine
PROTOCOL_PART_CPPFLAGS = $(COMMON_CPPFLAGS) $(PROTOCOL_PUBLIC) \
	-I$(top_srcdir)/src/protocol
SERVER_PART_CPPFLAGS = $(COMMON_CPPFLAGS) $(ENGINE_PUBLIC) \
	$(PROTOCOL_PUBLIC) $(SERVER_PUBLIC) -I$(top_srcdir)/src/server
CLI_PART_CPPFLAGS = $(COMMON_CPPFLAGS) $(ENGINE_PUBLIC) $(PROTOCOL_PUBLIC) \
	$(SERVER_PUBLIC) -I$(top_srcdir)/src/cli
PLUGIN_PART_CPPFLAGS = $(COMMON_CPPFLAGS) $(ENGINE_PUBLIC) \
	-I$(top_srcdir)/plugin
# Every part's own folder: for the test builds that compile several parts
# into one program (the sanitizer builds of pdio(1)).
ALL_PARTS_CPPFLAGS = $(COMMON_CPPFLAGS) $(ENGINE_PUBLIC) $(PROTOCOL_PUBLIC) \
	$(SERVER_PUBLIC) -I$(top_srcdir)/src/engine -I$(top_srcdir)/src/protocol \
	-I$(top_srcdir)/src/server -I$(top_srcdir)/src/cli
