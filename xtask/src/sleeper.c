/* The benchmark's node processes: `sleeper HOME N < LIST` moves itself into each cgroup of
 * LIST (one cgroup.procs path a line; writing 0 moves the writer), starts N children there
 * that only pause(), then goes back to HOME (a cgroup.procs) and waits to be killed. Each
 * child execs this small static binary again (no arguments: it pauses), as a node's
 * processes are exec'd: about 120 KiB of memory each, against 150-200 KiB for a `sleep`.
 *
 * Not forks left without exec: those shared their parent's pages, and each page the parent
 * wrote after a fork stayed mapped by the children before it, all in one anon_vma with
 * every child's mappings. A reclaim that samples pages' accessed bits through the reverse
 * map (this VM's kdamond, DAMON paddr) then walked 50,000 mappings per such page: 80 % of
 * a core during the large node's measurement, on a machine of two.
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
    if (argc <= 1) {
        for (;;)
            pause();
    }
    if (argc != 3) {
        fprintf(stderr, "usage: sleeper HOME N < CGROUP_PROCS_LIST\n");
        return 2;
    }
    /* Children that die are reaped by the kernel, never left as zombies. */
    signal(SIGCHLD, SIG_IGN);
    int n = atoi(argv[2]);
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        perror("/proc/self/exe");
        return 1;
    }
    self[len] = 0;
    char *child_argv[] = {"sleeper", NULL};
    char *child_env[] = {NULL};
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
                execve(self, child_argv, child_env);
                perror("execve");
                _exit(127);
            }
        }
    }
    enter(argv[1]);
    for (;;)
        pause();
}
