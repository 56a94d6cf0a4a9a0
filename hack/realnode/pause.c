/*
 * The Pod sandbox ("pause") process of the dev control plane's real node: it holds the Pod's
 * namespaces, reaps the zombies reparented to it, and exits on SIGINT/SIGTERM. No image can be
 * pulled here, so hack/realnode.sh builds it (gcc -static) into the image containerd's
 * sandbox_image names. Same behaviour as Kubernetes' build/pause/linux/pause.c.
 */
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
    puts("pause (managed-jobs dev real node)");
    return 0;
  }
  if (getpid() != 1) fprintf(stderr, "warning: pause should be the first process\n");
  struct sigaction stop = {.sa_handler = on_stop};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0)
    return 1;
  for (;;) pause();
}
