/* SPDX-License-Identifier: BSD-3-Clause */
/* The kernel nbd driver's generic netlink family ("nbd", linux/nbd-netlink.h)
 * through libnl-genl-3, the library nbd-client uses.  Netlink, not the
 * ioctls: a netlink-configured device needs no process parked in
 * NBD_DO_IT, takes fresh sockets for a live device (NBD_CMD_RECONFIGURE)
 * and can wait for them (NBD_ATTR_DEAD_CONN_TIMEOUT), which is what lets a
 * device outlive its server; a reconfigure also resizes a live device
 * (NBD_ATTR_SIZE_BYTES, Linux 5.3), and the device holds the image's
 * identity (NBD_ATTR_BACKEND_IDENTIFIER, Linux 5.14).
 */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <netlink/genl/ctrl.h>
#include <netlink/genl/genl.h>
#include <netlink/netlink.h>
#include <linux/nbd-netlink.h>

#include "pdio.h"

/* A connected generic netlink socket and the family's id. */
static struct nl_sock *
open_family (int *family, char *why, size_t len)
{
  struct nl_sock *s = nl_socket_alloc ();
  int err;

  if (s == NULL) {
    snprintf (why, len, "netlink: out of memory");
    return NULL;
  }
  if ((err = genl_connect (s)) < 0) {
    snprintf (why, len, "netlink: %s", nl_geterror (err));
    nl_socket_free (s);
    return NULL;
  }
  *family = genl_ctrl_resolve (s, NBD_GENL_FAMILY_NAME);
  if (*family < 0) {
    snprintf (why, len, "the kernel has no nbd netlink family (%s): is "
              "the nbd module loaded?", nl_geterror (*family));
    nl_socket_free (s);
    return NULL;
  }
  return s;
}

static struct nl_msg *
new_msg (int family, uint8_t cmd)
{
  struct nl_msg *m = nlmsg_alloc ();

  if (m && genlmsg_put (m, NL_AUTO_PORT, NL_AUTO_SEQ, family, 0, 0, cmd,
                        NBD_GENL_VERSION) == NULL) {
    nlmsg_free (m);
    m = NULL;
  }
  return m;
}

static int
put_sockets (struct nl_msg *m, const int *fds, unsigned n)
{
  struct nlattr *socks, *item;

  if ((socks = nla_nest_start (m, NBD_ATTR_SOCKETS)) == NULL)
    return -1;
  for (unsigned i = 0; i < n; i++) {
    if ((item = nla_nest_start (m, NBD_SOCK_ITEM)) == NULL ||
        nla_put_u32 (m, NBD_SOCK_FD, fds[i]) < 0)
      return -1;
    nla_nest_end (m, item);
  }
  nla_nest_end (m, socks);
  return 0;
}

/* Sends m and waits for the kernel's answer; valid messages go to cb. */
static bool
transact (struct nl_sock *s, struct nl_msg *m, const char *what,
          nl_recvmsg_msg_cb_t cb, void *arg, char *why, size_t len)
{
  int err;

  if (cb)
    nl_socket_modify_cb (s, NL_CB_VALID, NL_CB_CUSTOM, cb, arg);
  err = nl_send_sync (s, m);    /* frees m */
  if (err < 0) {
    /* libnl maps the kernel's errno onto its own codes; the kernel's
     * own message (dmesg) says more, e.g. "nbd0 already in use".
     */
    snprintf (why, len, "netlink %s: %s", what, nl_geterror (err));
    errno = err == -NLE_BUSY ? EBUSY : EPROTO;
    return false;
  }
  return true;
}

/* A command for nbd<index> (index -1: none named, NBD_CMD_CONNECT lets the
 * kernel pick): the family's socket in *sp and a message with
 * NBD_ATTR_INDEX put, or NULL (why says so, nothing left to free).
 */
static struct nl_msg *
begin_command (uint8_t cmd, const char *what, int index, struct nl_sock **sp,
               char *why, size_t len)
{
  int family;
  struct nl_msg *m;

  *sp = open_family (&family, why, len);
  if (*sp == NULL)
    return NULL;
  m = new_msg (family, cmd);
  if (m == NULL ||
      (index >= 0 && nla_put_u32 (m, NBD_ATTR_INDEX, index) < 0)) {
    snprintf (why, len, "netlink: cannot build %s", what);
    nlmsg_free (m);
    nl_socket_free (*sp);
    return NULL;
  }
  return m;
}

/* Sends m if built (every attribute went in) and frees s and m. */
static bool
end_command (struct nl_sock *s, struct nl_msg *m, bool built,
             const char *what, nl_recvmsg_msg_cb_t cb, void *arg,
             char *why, size_t len)
{
  bool ok = false;
  int err;

  if (!built) {
    snprintf (why, len, "netlink: cannot build %s", what);
    nlmsg_free (m);
  }
  else
    ok = transact (s, m, what, cb, arg, why, len);
  err = errno;
  nl_socket_free (s);
  errno = err;
  return ok;
}

/* The kernel answers a connect with the device's index. */
static int
connect_cb (struct nl_msg *m, void *arg)
{
  int *index = arg;
  struct nlattr *attrs[NBD_ATTR_MAX + 1];

  if (genlmsg_parse (nlmsg_hdr (m), 0, attrs, NBD_ATTR_MAX, NULL) == 0 &&
      attrs[NBD_ATTR_INDEX])
    *index = nla_get_u32 (attrs[NBD_ATTR_INDEX]);
  return NL_OK;
}

int
nbdnl_connect (const struct nbdnl_device *d, const int *fds, unsigned n,
               char *why, size_t len)
{
  const char *what = "NBD_CMD_CONNECT";
  struct nl_sock *s;
  struct nl_msg *m = begin_command (NBD_CMD_CONNECT, what, d->index, &s,
                                    why, len);
  int index = -1;

  if (m == NULL ||
      !end_command (s, m,
                    nla_put_u64 (m, NBD_ATTR_SIZE_BYTES, d->size) >= 0 &&
                    nla_put_u64 (m, NBD_ATTR_BLOCK_SIZE_BYTES,
                                 d->block_size) >= 0 &&
                    nla_put_u64 (m, NBD_ATTR_SERVER_FLAGS,
                                 d->server_flags) >= 0 &&
                    nla_put_u64 (m, NBD_ATTR_CLIENT_FLAGS,
                                 d->client_flags) >= 0 &&
                    nla_put_u64 (m, NBD_ATTR_TIMEOUT, d->timeout) >= 0 &&
                    nla_put_u64 (m, NBD_ATTR_DEAD_CONN_TIMEOUT,
                                 d->dead_timeout) >= 0 &&
                    (d->backend == NULL ||
                     nla_put_string (m, NBD_ATTR_BACKEND_IDENTIFIER,
                                     d->backend) >= 0) &&
                    put_sockets (m, fds, n) >= 0,
                    what, connect_cb, &index, why, len))
    return -1;
  /* Without an answer it can only be the device asked for. */
  if (index < 0)
    index = d->index;
  if (index < 0)
    snprintf (why, len, "netlink %s: the kernel did not say which device "
              "it connected", what);
  return index;
}

bool
nbdnl_disconnect (int index, char *why, size_t len)
{
  const char *what = "NBD_CMD_DISCONNECT";
  struct nl_sock *s;
  struct nl_msg *m = begin_command (NBD_CMD_DISCONNECT, what, index, &s,
                                    why, len);

  return m != NULL && end_command (s, m, true, what, NULL, NULL, why, len);
}

bool
nbdnl_reconfigure (int index, const struct nbdnl_change *c, char *why,
                   size_t len)
{
  const char *what = "NBD_CMD_RECONFIGURE";
  struct nl_sock *s;
  struct nl_msg *m = begin_command (NBD_CMD_RECONFIGURE, what, index, &s,
                                    why, len);

  return m != NULL &&
    end_command (s, m,
                 (c->backend == NULL ||
                  nla_put_string (m, NBD_ATTR_BACKEND_IDENTIFIER,
                                  c->backend) >= 0) &&
                 (c->n == 0 || put_sockets (m, c->fds, c->n) >= 0) &&
                 (c->client_flags < 0 ||
                  nla_put_u64 (m, NBD_ATTR_CLIENT_FLAGS,
                               c->client_flags) >= 0) &&
                 (c->size == 0 ||
                  nla_put_u64 (m, NBD_ATTR_SIZE_BYTES, c->size) >= 0),
                 what, NULL, NULL, why, len);
}

struct status_arg {
  int index;
  int connected;
};

static int
status_cb (struct nl_msg *m, void *arg)
{
  struct status_arg *a = arg;
  struct nlattr *attrs[NBD_ATTR_MAX + 1], *item;
  int rem;

  if (genlmsg_parse (nlmsg_hdr (m), 0, attrs, NBD_ATTR_MAX, NULL) < 0 ||
      attrs[NBD_ATTR_DEVICE_LIST] == NULL)
    return NL_OK;
  nla_for_each_nested (item, attrs[NBD_ATTR_DEVICE_LIST], rem) {
    struct nlattr *dev[NBD_DEVICE_ATTR_MAX + 1];

    if (nla_type (item) != NBD_DEVICE_ITEM ||
        nla_parse_nested (dev, NBD_DEVICE_ATTR_MAX, item, NULL) < 0 ||
        dev[NBD_DEVICE_INDEX] == NULL || dev[NBD_DEVICE_CONNECTED] == NULL)
      continue;
    if ((int) nla_get_u32 (dev[NBD_DEVICE_INDEX]) == a->index)
      a->connected = nla_get_u8 (dev[NBD_DEVICE_CONNECTED]) != 0;
  }
  return NL_OK;
}

int
nbdnl_status (int index, char *why, size_t len)
{
  const char *what = "NBD_CMD_STATUS";
  struct status_arg a = { .index = index, .connected = -1 };
  struct nl_sock *s;
  struct nl_msg *m = begin_command (NBD_CMD_STATUS, what, index, &s, why,
                                    len);

  if (m != NULL && end_command (s, m, true, what, status_cb, &a, why, len) &&
      a.connected < 0)
    snprintf (why, len, "netlink NBD_CMD_STATUS: no answer for nbd%d",
              index);
  return a.connected;
}

struct nl_sock *
nbdnl_events_open (char *why, size_t len)
{
  int family, group, err;
  struct nl_sock *s = open_family (&family, why, len);

  if (s == NULL)
    return NULL;
  group = genl_ctrl_resolve_grp (s, NBD_GENL_FAMILY_NAME,
                                 NBD_GENL_MCAST_GROUP_NAME);
  if (group < 0 || (err = nl_socket_add_membership (s, group)) < 0) {
    snprintf (why, len, "netlink: cannot join %s: %s",
              NBD_GENL_MCAST_GROUP_NAME,
              nl_geterror (group < 0 ? group : err));
    nl_socket_free (s);
    return NULL;
  }
  /* Events are not answers to our requests. */
  nl_socket_disable_seq_check (s);
  nl_socket_set_nonblocking (s);
  return s;
}

int
nbdnl_events_fd (struct nl_sock *s)
{
  return nl_socket_get_fd (s);
}

static int
event_cb (struct nl_msg *m, void *arg)
{
  int *index = arg;
  struct genlmsghdr *g = nlmsg_data (nlmsg_hdr (m));
  struct nlattr *attrs[NBD_ATTR_MAX + 1];

  if (g->cmd == NBD_CMD_LINK_DEAD &&
      genlmsg_parse (nlmsg_hdr (m), 0, attrs, NBD_ATTR_MAX, NULL) == 0 &&
      attrs[NBD_ATTR_INDEX])
    *index = nla_get_u32 (attrs[NBD_ATTR_INDEX]);
  return NL_OK;
}

int
nbdnl_events_read (struct nl_sock *s)
{
  struct nl_cb *cb = nl_socket_get_cb (s);
  int index = -2, n;

  nl_cb_set (cb, NL_CB_VALID, NL_CB_CUSTOM, event_cb, &index);
  n = nl_recvmsgs_report (s, cb);
  nl_cb_put (cb);
  if (n == 0 || n == -NLE_AGAIN)
    return -3;
  if (n < 0)
    return -1;
  return index;
}
