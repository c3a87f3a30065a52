/* The benchmark's node processes: `sleeper HOME N < LIST` moves itself into each cgroup of
 * LIST (one cgroup.procs path a line; writing 0 moves the writer), forks N children there
 * that only pause(), then goes back to HOME (a cgroup.procs) and waits to be killed. Forks without exec from a small
 * static process: about 95 KiB of memory each, against 150-200 KiB for a `sleep`.
 * Built by `cargo xtask bench` (xtask/src/bignode.rs). */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void enter(const char *procs) {
    int fd = open(procs, O_WRONLY);
    if (fd < 0 || write(fd, "0", 1) != 1) {
        perror(procs);
        exit(1);
    }
    close(fd);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: sleeper HOME N < CGROUP_PROCS_LIST\n");
        return 2;
    }
    /* Children that die are reaped by the kernel, never left as zombies. */
    signal(SIGCHLD, SIG_IGN);
    int n = atoi(argv[2]);
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (!line[0])
            continue;
        enter(line);
        for (int k = 0; k < n; k++) {
            pid_t p = fork();
            if (p < 0) {
                perror("fork");
                return 1;
            }
            if (p == 0) {
                for (;;)
                    pause();
            }
        }
    }
    enter(argv[1]);
    for (;;)
        pause();
}
