/* The oldest symbol version of the architecture's glibc, for dlvsym look-ups in the tests. */
#ifndef GLIBC_BASE_H
#define GLIBC_BASE_H
#if defined(__aarch64__)
#define BASE_VERSION "GLIBC_2.17"
#else
#define BASE_VERSION "GLIBC_2.2.5"
#endif
#endif
