/* The pod sandbox's process for tests/cluster/nodes' pause image: holds the pod's
 * namespaces, reaps orphans (it is PID 1 when the pod shares its PID namespace) and
 * exits 0 on SIGINT/SIGTERM. Built static by oci-busybox.sh (gcc -static). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
    (void)sig;
    _exit(0);
}

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && argv[1][0] == '-' && argv[1][1] == 'v') {
        puts("h3i-pause 1");
        return 0;
    }
    struct sigaction stop = {.sa_handler = on_stop}, child = {.sa_handler = on_child};
    if (sigaction(SIGINT, &stop, NULL) || sigaction(SIGTERM, &stop, NULL) ||
        sigaction(SIGCHLD, &child, NULL)) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;)
        pause();
}
