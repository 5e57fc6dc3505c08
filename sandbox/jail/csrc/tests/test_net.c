/* net.c: loopback, TCP buffers, the egress listener. */
#define _GNU_SOURCE
#include "harness.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

static int loopback_up(void)
{
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	struct ifreq ifr;
	memset(&ifr, 0, sizeof ifr);
	strcpy(ifr.ifr_name, "lo");
	int ok = s >= 0 && ioctl(s, SIOCGIFFLAGS, &ifr) == 0 && (ifr.ifr_flags & IFF_UP);
	close(s);
	return ok;
}

/* Loopback alone, up, with the job's TCP buffer bounds. */
static int loopback_and_buffers(void)
{
	struct kj_job j = test_job();
	j.rmem = "4096 65536 1048576";
	j.wmem = "4096 16384 524288";
	CHECK_OK(kj_unshare(&j));
	CHECK(!loopback_up(), "loopback is up before");
	CHECK_OK(kj_mount(&j));
	CHECK(loopback_up(), "loopback is down");
	char buf[128];
	CHECK(read_file("/proc/sys/net/ipv4/tcp_rmem", buf, sizeof buf) > 0 && strcmp(buf, "4096\t65536\t1048576\n") == 0,
	      "tcp_rmem %s", buf);
	CHECK(read_file("/proc/sys/net/ipv4/tcp_wmem", buf, sizeof buf) > 0 && strcmp(buf, "4096\t16384\t524288\n") == 0,
	      "tcp_wmem %s", buf);
	char ifs[512];
	CHECK(read_file("/proc/net/dev", ifs, sizeof ifs) > 0, "/proc/net/dev");
	int n = 0;
	for (char *p = ifs; (p = strchr(p, ':')) != NULL; p++)
		n++;
	CHECK(n == 1 && strstr(ifs, "lo:"), "interfaces: %s", ifs);
	return 0;
}

/* The egress listener: on 127.0.0.1:port of the job's namespace, handed
 * over on the channel, listening. */
static int egress_listener(void)
{
	int ch[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, ch) == 0, "socketpair");
	struct kj_job j = test_job();
	j.egress_port = 8088;
	j.egress_fd = ch[1];
	CHECK_OK(kj_unshare(&j));
	char b;
	struct iovec iov = {&b, 1};
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
	CHECK(recvmsg(ch[0], &m, 0) == 1 && b == 'L', "no listener came");
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	CHECK(c && c->cmsg_type == SCM_RIGHTS, "no descriptor came");
	int ln;
	memcpy(&ln, CMSG_DATA(c), sizeof ln);
	struct sockaddr_in a;
	socklen_t al = sizeof a;
	int listening = 0;
	socklen_t ll = sizeof listening;
	CHECK(getsockname(ln, (struct sockaddr *)&a, &al) == 0 && getsockopt(ln, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ll) == 0,
	      "getsockname");
	CHECK(a.sin_addr.s_addr == htonl(INADDR_LOOPBACK) && ntohs(a.sin_port) == 8088 && listening, "listener %s:%d (%d)",
	      inet_ntoa(a.sin_addr), ntohs(a.sin_port), listening);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(connect(s, (struct sockaddr *)&a, sizeof a) == 0, "connect to the listener");
	int conn = accept(ln, NULL, NULL);
	CHECK(conn >= 0, "accept");
	return 0;
}

int main(void)
{
	int failed = 0;
	failed += run_case("loopback_and_buffers", loopback_and_buffers);
	failed += run_case("egress_listener", egress_listener);
	return failed ? 1 : 0;
}
