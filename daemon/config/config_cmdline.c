/* config_cmdline.c: kvcached's command line, and the configuration it selects
 * (defaults, then the config file, then the flags). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "kvcache/kvcache.h"

static const struct {
  const char *flag;
  enum config_action action;
} actions[] = {
    {"--help", CONFIG_HELP},          {"-h", CONFIG_HELP},
    {"--version", CONFIG_VERSION},    {"--print-config", CONFIG_PRINT},
    {"--check-config", CONFIG_CHECK}, {"--example-config", CONFIG_EXAMPLE},
};

/* 1 if arg is an action flag (sets out->action), 0 if not, -1 on a conflict. */
static int take_action(const char *arg, config_cmdline_t *out, char *err, size_t errlen) {
  for (size_t i = 0; i < sizeof actions / sizeof actions[0]; i++) {
    if (strcmp(arg, actions[i].flag) != 0) continue;
    enum config_action a = actions[i].action;
    if (out->action != CONFIG_RUN && out->action != a && a != CONFIG_HELP &&
        out->action != CONFIG_HELP) {
      snprintf(err, errlen, "%s cannot be combined with another action", arg);
      return -1;
    }
    if (out->action != CONFIG_HELP) out->action = a; /* --help wins */
    return 1;
  }
  return 0;
}

int config_cmdline_parse(int argc, char **argv, config_cmdline_t *out, char *err,
                         size_t errlen) {
  memset(out, 0, sizeof *out);
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    int a = take_action(arg, out, err, errlen);
    if (a < 0) return -1;
    if (a > 0) continue;
    if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
      snprintf(err, errlen, "unexpected argument '%s' (see --help)", arg);
      return -1;
    }
    const char *eq = strchr(arg + 2, '=');
    size_t nlen = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    char name[64];
    if (nlen >= sizeof name) {
      snprintf(err, errlen, "unknown option '%.80s' (see --help)", arg);
      return -1;
    }
    memcpy(name, arg + 2, nlen);
    name[nlen] = '\0';
    const char *value;
    if (eq) {
      value = eq + 1;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      snprintf(err, errlen, "option '%s' needs a value", arg);
      return -1;
    }
    if (strcmp(name, "config") == 0) {
      if (*value == '\0' || strlen(value) >= sizeof out->config_path) {
        snprintf(err, errlen, "--config: path empty or too long");
        return -1;
      }
      snprintf(out->config_path, sizeof out->config_path, "%s", value);
      out->config_given = true;
      continue;
    }
    if (config_option_index(name) < 0) {
      snprintf(err, errlen, "unknown option '--%s' (see --help)", name);
      return -1;
    }
    if (out->nflags == CONFIG_MAX_FLAGS) {
      snprintf(err, errlen, "more than %d option flags", CONFIG_MAX_FLAGS);
      return -1;
    }
    snprintf(out->flags[out->nflags].name, sizeof out->flags[0].name, "%s", name);
    out->flags[out->nflags].value = value;
    out->nflags++;
  }
  return 0;
}

int config_load(const config_cmdline_t *cmd, config_t *out, char *used_path,
                size_t used_len, char *err, size_t errlen) {
  config_t cfg;
  config_defaults(&cfg);
  const char *path = NULL;
  if (cmd->config_given)
    path = cmd->config_path;
  else if (access(CONFIG_DEFAULT_PATH, F_OK) == 0)
    path = CONFIG_DEFAULT_PATH;
  if (path && config_file_apply(&cfg, path, err, errlen) != 0) return -1;
  for (int i = 0; i < cmd->nflags; i++) {
    char why[256];
    if (config_set(&cfg, cmd->flags[i].name, cmd->flags[i].value, why, sizeof why) != 0) {
      snprintf(err, errlen, "command line: %s", why);
      return -1;
    }
  }
  char why[256];
  if (config_validate(&cfg, why, sizeof why) != 0) {
    snprintf(err, errlen, "invalid configuration%s%s: %s", path ? " from " : "",
             path ? path : "", why);
    return -1;
  }
  *out = cfg;
  if (used_path) snprintf(used_path, used_len, "%s", path ? path : "");
  return 0;
}

void config_print_help(FILE *f) {
  fprintf(f,
          "usage: kvcached [--config FILE] [--OPTION VALUE]...\n"
          "       kvcached [--config FILE] [--OPTION VALUE]... --print-config | --check-config\n"
          "       kvcached --example-config | --help | --version\n"
          "\n"
          "kvcached %s: the node-local KV-cache daemon. It runs in the foreground, logs\n"
          "key=value lines to stderr and serves libkvcache clients on a Unix socket.\n"
          "\n"
          "Actions:\n"
          "  --config FILE          read FILE (must exist); without it %s\n"
          "                         is read if it exists. Flags override the file.\n"
          "  --print-config         print the effective configuration as a config file, exit\n"
          "  --check-config         validate the file and flags, exit 0 (or 2 with the error)\n"
          "  --example-config       print the commented example file (every option, default)\n"
          "  --help                 this text\n"
          "  --version              print the version\n"
          "\n"
          "Options (also --OPTION=VALUE; dashes or underscores; the same names, with\n"
          "underscores, in the file). Sizes are binary: B, K or KiB, M or MiB, G or GiB,\n"
          "T or TiB, letters in either case (2g = 2G = 2GiB = 2147483648); KB, MB, GB and\n"
          "TB are refused as ambiguous:\n\n",
          KVC_VERSION_STRING, CONFIG_DEFAULT_PATH);
  config_print_options_help(f);
  fprintf(f,
          "\n"
          "Signals:\n"
          "  SIGTERM, SIGINT        drain: stop accepting, answer the requests already\n"
          "                         received, tell each client SHUTDOWN, exit 0. A second\n"
          "                         signal exits at once (status 1).\n"
          "  SIGHUP                 reload the file and flags; reloadable options change,\n"
          "                         the others are logged as needing a restart. An invalid\n"
          "                         file keeps the running configuration (logged as error).\n"
          "\n"
          "systemd:\n"
          "  LISTEN_FDS, LISTEN_PID socket activation: the passed Unix stream socket is\n"
          "                         used and the socket option is ignored.\n"
          "  NOTIFY_SOCKET          readiness: READY=1 once listening with the pool backed,\n"
          "                         RELOADING=1/READY=1 around a reload, STOPPING=1, and a\n"
          "                         STATUS= line every status_interval_ms.\n"
          "\n"
          "Exit status: 0 after a drain or an action, 1 when starting fails or on a second\n"
          "signal, 2 for a bad command line or configuration.\n");
}
