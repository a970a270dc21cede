/* A minimal test harness: each program holds a table of named tests; with a name as
 * argument it runs that one (meson registers one test per name), else all of them. */
#ifndef FERRY_CHECK_H
#define FERRY_CHECK_H

#include "ferry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern int check_failures;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);  \
            check_failures++;                                                         \
            return;                                                                   \
        }                                                                             \
    } while (0)

#define CHECK_EQ_U(a, b)                                                                       \
    do {                                                                                       \
        unsigned long long check_a_ = (unsigned long long) (a), check_b_ = (unsigned long long) (b); \
        if (check_a_ != check_b_) {                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%llu != %llu)\n", __FILE__, __LINE__, \
                    #a, #b, check_a_, check_b_);                                               \
            check_failures++;                                                                  \
            return;                                                                            \
        }                                                                                      \
    } while (0)

#define CHECK_OK(expr)                                                                        \
    do {                                                                                      \
        ferry_status check_st_ = (expr);                                                      \
        if (check_st_ != FERRY_OK) {                                                          \
            fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #expr,         \
                    ferry_status_name(check_st_), ferry_last_error());                        \
            check_failures++;                                                                 \
            return;                                                                           \
        }                                                                                     \
    } while (0)

/* expr must fail with status st and leave a message. */
#define CHECK_FAILS(expr, st)                                                                 \
    do {                                                                                      \
        ferry_clear_error();                                                                  \
        ferry_status check_st_ = (expr);                                                      \
        if (check_st_ != (st) || ferry_last_error()[0] == '\0') {                             \
            fprintf(stderr, "%s:%d: %s gave '%s' (%s), expected '%s'\n", __FILE__, __LINE__, #expr, \
                    ferry_status_name(check_st_), ferry_last_error(), ferry_status_name(st)); \
            check_failures++;                                                                 \
            return;                                                                           \
        }                                                                                     \
    } while (0)

/* Run a helper that uses CHECK; stop the caller if it failed. */
#define SUB(call)                               \
    do {                                        \
        const int sub_before_ = check_failures; \
        call;                                   \
        if (check_failures != sub_before_) {    \
            return;                             \
        }                                       \
    } while (0)

typedef struct {
    const char * name;
    void (*fn)(void);
} check_test;

#define CHECK_MAIN(table)                                                                     \
    int check_failures = 0;                                                                   \
    int main(int argc, char ** argv) {                                                        \
        const size_t n = sizeof(table) / sizeof(table[0]);                                    \
        int ran = 0, failed = 0;                                                              \
        for (size_t i = 0; i < n; i++) {                                                      \
            if (argc > 1 && strcmp(argv[1], table[i].name) != 0) continue;                    \
            const int before = check_failures;                                                \
            table[i].fn();                                                                    \
            ran++;                                                                            \
            const int bad = check_failures != before;                                         \
            failed += bad;                                                                    \
            printf("%s %s\n", bad ? "FAIL" : "ok  ", table[i].name);                          \
        }                                                                                     \
        if (ran == 0) {                                                                       \
            fprintf(stderr, "no test named %s\n", argc > 1 ? argv[1] : "(none)");             \
            return 2;                                                                         \
        }                                                                                     \
        printf("%d passed, %d failed\n", ran - failed, failed);                               \
        return failed ? 1 : 0;                                                                \
    }

#endif
