/* json.h: a strict little JSON reader for tests that check kvcachectl's
 * --json output, so the suite needs no interpreter to parse it.
 *
 * json_parse() checks the whole text against RFC 8259 (one value, nothing
 * after it but white space) and returns a tree, or NULL with the byte offset
 * of the first error in *err_at. json_get() walks a path of object keys;
 * json_num() and json_len() read a node. Strings are decoded (escapes, \u
 * as UTF-8), so a key holding a quote is found by its plain spelling.
 *
 *   json_t *j = json_parse(out, &at);
 *   double seqs = json_num(json_get(j, "global", "sequences", NULL));
 *   json_free(j);
 */
#ifndef KVC_IT_JSON_H
#define KVC_IT_JSON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUM, JSON_STR, JSON_ARR, JSON_OBJ } json_kind_t;

typedef struct json {
  json_kind_t kind;
  double num;           /* JSON_NUM; JSON_BOOL: 0 or 1 */
  char *str;            /* JSON_STR: the decoded string */
  char *key;            /* a member of an object: its decoded key */
  struct json *kids;    /* JSON_ARR, JSON_OBJ: the first element or member */
  struct json *next;    /* the next sibling */
  size_t n;             /* JSON_ARR, JSON_OBJ: how many kids */
} json_t;

typedef struct {
  const char *s;        /* the text */
  size_t i;             /* the read position */
  int depth;            /* nesting, bounded */
} json_rd_t;

__attribute__((unused)) static json_t *json_value_(json_rd_t *r);

__attribute__((unused)) static void json_free(json_t *j) {
  while (j) {
    json_t *next = j->next;
    json_free(j->kids);
    free(j->str);
    free(j->key);
    free(j);
    j = next;
  }
}

__attribute__((unused)) static void json_ws_(json_rd_t *r) {
  while (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r')
    r->i++;
}

__attribute__((unused)) static int json_hex_(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* A string at r->i (its opening quote); returns it decoded, or NULL. */
__attribute__((unused)) static char *json_string_(json_rd_t *r) {
  if (r->s[r->i] != '"') return NULL;
  r->i++;
  size_t cap = 16, len = 0;
  char *out = malloc(cap);
  ASSERT(out != NULL);
  for (;;) {
    unsigned char c = (unsigned char)r->s[r->i];
    if (c == '"') break;
    if (c < 0x20) goto fail; /* unescaped control character, or the end */
    unsigned cp = c;
    r->i++;
    if (c == '\\') {
      char e = r->s[r->i++];
      const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
      const char *at = e ? strchr(from, e) : NULL;
      if (at) {
        cp = (unsigned char)to[at - from];
      } else if (e == 'u') {
        cp = 0;
        for (int k = 0; k < 4; k++) {
          int h = json_hex_(r->s[r->i++]);
          if (h < 0) goto fail;
          cp = cp * 16 + (unsigned)h;
        }
        if (cp >= 0xd800 && cp < 0xe000) cp = 0xfffd; /* surrogates: not needed here */
      } else {
        goto fail;
      }
    }
    if (len + 4 >= cap) {
      cap *= 2;
      out = realloc(out, cap);
      ASSERT(out != NULL);
    }
    if (cp < 0x80 || c >= 0x80) { /* ASCII, or raw UTF-8 bytes kept as they are */
      out[len++] = (char)cp;
    } else if (cp < 0x800) {
      out[len++] = (char)(0xc0 | cp >> 6);
      out[len++] = (char)(0x80 | (cp & 0x3f));
    } else {
      out[len++] = (char)(0xe0 | cp >> 12);
      out[len++] = (char)(0x80 | ((cp >> 6) & 0x3f));
      out[len++] = (char)(0x80 | (cp & 0x3f));
    }
  }
  r->i++;
  out[len] = '\0';
  return out;
fail:
  free(out);
  return NULL;
}

/* A number as RFC 8259 spells it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
__attribute__((unused)) static bool json_number_(json_rd_t *r, double *v) {
  const char *s = r->s;
  size_t i = r->i;
  if (s[i] == '-') i++;
  if (s[i] == '0') i++;
  else if (s[i] >= '1' && s[i] <= '9') while (s[i] >= '0' && s[i] <= '9') i++;
  else return false;
  if (s[i] == '.') {
    if (!(s[++i] >= '0' && s[i] <= '9')) return false;
    while (s[i] >= '0' && s[i] <= '9') i++;
  }
  if (s[i] == 'e' || s[i] == 'E') {
    i++;
    if (s[i] == '+' || s[i] == '-') i++;
    if (!(s[i] >= '0' && s[i] <= '9')) return false;
    while (s[i] >= '0' && s[i] <= '9') i++;
  }
  *v = strtod(s + r->i, NULL);
  r->i = i;
  return true;
}

/* The elements of an array or the members of an object, after its opener. */
__attribute__((unused)) static bool json_items_(json_rd_t *r, json_t *j, char close) {
  json_t **tail = &j->kids;
  json_ws_(r);
  if (r->s[r->i] == close) {
    r->i++;
    return true;
  }
  for (;;) {
    char *key = NULL;
    json_ws_(r);
    if (close == '}') {
      if (!(key = json_string_(r))) return false;
      json_ws_(r);
      if (r->s[r->i] != ':') {
        free(key);
        return false;
      }
      r->i++;
    }
    json_t *kid = json_value_(r);
    if (!kid) {
      free(key);
      return false;
    }
    kid->key = key;
    *tail = kid;
    tail = &kid->next;
    j->n++;
    json_ws_(r);
    char c = r->s[r->i++];
    if (c == close) return true;
    if (c != ',') return false;
  }
}

__attribute__((unused)) static json_t *json_value_(json_rd_t *r) {
  json_t *j = calloc(1, sizeof *j);
  ASSERT(j != NULL);
  json_ws_(r);
  char c = r->s[r->i];
  bool ok = true;
  if (++r->depth > 64) {
    ok = false;
  } else if (c == '{' || c == '[') {
    j->kind = c == '{' ? JSON_OBJ : JSON_ARR;
    r->i++;
    ok = json_items_(r, j, c == '{' ? '}' : ']');
  } else if (c == '"') {
    j->kind = JSON_STR;
    ok = (j->str = json_string_(r)) != NULL;
  } else if (strncmp(r->s + r->i, "true", 4) == 0 || strncmp(r->s + r->i, "false", 5) == 0) {
    j->kind = JSON_BOOL;
    j->num = c == 't';
    r->i += c == 't' ? 4 : 5;
  } else if (strncmp(r->s + r->i, "null", 4) == 0) {
    r->i += 4;
  } else {
    j->kind = JSON_NUM;
    ok = json_number_(r, &j->num);
  }
  r->depth--;
  if (!ok) {
    json_free(j);
    return NULL;
  }
  return j;
}

/* Parses text (borrows it); returns a new tree, or NULL with the offset of
 * the error in *err_at. */
__attribute__((unused)) static json_t *json_parse(const char *text, size_t *err_at) {
  json_rd_t r = {.s = text};
  json_t *j = json_value_(&r);
  if (j) {
    json_ws_(&r);
    if (r.s[r.i] == '\0') return j;
    json_free(j);
  }
  size_t len = strlen(text);
  *err_at = r.i < len ? r.i : len;
  return NULL;
}

/* The member of an object by key (NULL when j is not an object or lacks it). */
__attribute__((unused)) static json_t *json_member(const json_t *j, const char *key) {
  if (!j || j->kind != JSON_OBJ) return NULL;
  for (json_t *k = j->kids; k; k = k->next)
    if (strcmp(k->key, key) == 0) return k;
  return NULL;
}

/* Follows the NULL-terminated keys from j; fails the test if one is absent. */
__attribute__((unused)) static json_t *json_get(const json_t *j, ...) {
  va_list ap;
  va_start(ap, j);
  const char *key;
  while ((key = va_arg(ap, const char *))) {
    const json_t *m = json_member(j, key);
    if (!m) TEST_FAIL_("JSON: no member \"%s\"", key);
    j = m;
  }
  va_end(ap);
  return (json_t *)j;
}

/* The element i of an array; fails the test if there is none. */
__attribute__((unused)) static json_t *json_at(const json_t *j, size_t i) {
  if (!j || j->kind != JSON_ARR || i >= j->n) TEST_FAIL_("JSON: no element %zu", i);
  json_t *k = j->kids;
  while (i--) k = k->next;
  return k;
}

/* A number's value; fails the test if j is not a number. */
__attribute__((unused)) static double json_num(const json_t *j) {
  if (!j || j->kind != JSON_NUM) TEST_FAIL_("JSON: not a number");
  return j->num;
}

/* A whole number's value as u64; fails the test if j is not one. */
__attribute__((unused)) static uint64_t json_u64(const json_t *j) {
  double v = json_num(j);
  if (v < 0 || v != (double)(uint64_t)v) TEST_FAIL_("JSON: %g is not a count", v);
  return (uint64_t)v;
}

/* Elements or members of an array or object; fails the test otherwise. */
__attribute__((unused)) static size_t json_len(const json_t *j) {
  if (!j || (j->kind != JSON_ARR && j->kind != JSON_OBJ)) TEST_FAIL_("JSON: not a container");
  return j->n;
}

/* Parses text, failing the test (with where) if it is not valid JSON. */
__attribute__((unused)) static json_t *json_parse_or_fail(const char *text) {
  size_t at = 0;
  json_t *j = json_parse(text, &at);
  if (!j) TEST_FAIL_("not valid JSON at byte %zu: \"%.40s\"", at, text + at);
  return j;
}

#endif
