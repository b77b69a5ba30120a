/*
 * LD_PRELOAD shim for the lab's ingress nginx: every socket it accepts gets
 * SO_MAX_PACING_RATE. Any value but ~0 makes the kernel pace the TCP flow itself
 * (1.2 x cwnd / srtt in congestion avoidance, 2 x in slow start), which is how TCP
 * runs on hosts with the fq qdisc. Kernels built without sch_fq have no other way
 * to pace a CUBIC sender. The rate given is far above any lab path, so only the
 * kernel's own pacing rate applies.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/socket.h>

static void pace(int fd)
{
    unsigned int rate = 0xFFFFFFFEu;

    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof rate);
}

int accept4(int s, struct sockaddr *a, socklen_t *l, int flags)
{
    static int (*real)(int, struct sockaddr *, socklen_t *, int);
    int fd;

    if (!real)
        real = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
    fd = real(s, a, l, flags);
    pace(fd);
    return fd;
}

int accept(int s, struct sockaddr *a, socklen_t *l)
{
    static int (*real)(int, struct sockaddr *, socklen_t *);
    int fd;

    if (!real)
        real = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
    fd = real(s, a, l);
    pace(fd);
    return fd;
}
