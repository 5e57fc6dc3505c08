/* Prints struct kj_job's layout as "field offset" lines and "sizeof n":
 * the Python binding's (deploy/images/python/jail.py) must be the same. */
#include <stddef.h>
#include <stdio.h>

#include "../jail.h"

#define FIELD(f) printf("%s %zu\n", #f, offsetof(struct kj_job, f))

int main(void)
{
	FIELD(abi);
	FIELD(uid);
	FIELD(new_pid);
	FIELD(egress_port);
	FIELD(egress_fd);
	FIELD(proc_fd);
	FIELD(keep);
	FIELD(cpu_s);
	FIELD(fsize);
	FIELD(nofile);
	FIELD(tmp_mb);
	FIELD(work);
	FIELD(rmem);
	FIELD(wmem);
	FIELD(masked);
	FIELD(readonly);
	FIELD(filter);
	FIELD(filter_len);
	FIELD(err);
	printf("sizeof %zu\nabi %d\n", sizeof(struct kj_job), KJ_ABI);
	return 0;
}
