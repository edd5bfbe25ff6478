/* The durable floor of a resumable runner, for benches/core.sh: each line of LINES (a program
 * and its arguments, split on spaces) started with posix_spawnp in DIR, waited for, then one
 * small record appended to a journal and fdatasync'd. The least a runner that survives kill -9
 * can do per sub-change. Usage: floor DIR LINES */
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: floor DIR LINES\n");
        return 2;
    }
    FILE *lines = fopen(argv[2], "r");
    if (!lines || chdir(argv[1]) != 0) {
        perror("floor");
        return 1;
    }
    int journal = open("floor.journal", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (journal < 0) {
        perror("floor.journal");
        return 1;
    }
    char line[4096];
    long seq = 0;
    while (fgets(line, sizeof line, lines)) {
        char *args[64], *save = NULL;
        int n = 0;
        for (char *t = strtok_r(line, " \n", &save); t && n < 63; t = strtok_r(NULL, " \n", &save))
            args[n++] = t;
        args[n] = NULL;
        if (n == 0)
            continue;
        pid_t pid;
        if (posix_spawnp(&pid, args[0], NULL, NULL, args, environ) != 0) {
            perror(args[0]);
            return 1;
        }
        int status;
        if (waitpid(pid, &status, 0) < 0) {
            perror("waitpid");
            return 1;
        }
        char record[64];
        int len = snprintf(record, sizeof record, "{\"seq\":%ld,\"type\":\"sub_done\"}\n", seq++);
        if (write(journal, record, (size_t)len) != len || fdatasync(journal) != 0) {
            perror("floor.journal");
            return 1;
        }
    }
    return 0;
}
