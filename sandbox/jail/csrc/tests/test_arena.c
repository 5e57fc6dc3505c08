/* arena.c: the Python object arenas' range, against a stand-in for
 * CPython's arena allocator hooks (the library's are weak references,
 * which these definitions fill). */
#define _GNU_SOURCE
#include "harness.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define MiB (1UL << 20)

/* CPython's PyObjectArenaAllocator. */
struct arena_allocator {
	void *ctx;
	void *(*alloc)(void *ctx, size_t size);
	void (*free)(void *ctx, void *ptr, size_t size);
};

static int cpython_allocs, cpython_frees;

static void *cpython_alloc(void *ctx, size_t size)
{
	(void)ctx;
	cpython_allocs++;
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static void cpython_free(void *ctx, void *p, size_t size)
{
	(void)ctx;
	cpython_frees++;
	munmap(p, size);
}

static struct arena_allocator current = {NULL, cpython_alloc, cpython_free};

void PyObject_GetArenaAllocator(struct arena_allocator *a);
void PyObject_SetArenaAllocator(struct arena_allocator *a);
void PyObject_GetArenaAllocator(struct arena_allocator *a) { *a = current; }
void PyObject_SetArenaAllocator(struct arena_allocator *a) { current = *a; }

static void *arena(size_t size) { return current.alloc(current.ctx, size); }
static void release(void *p, size_t size) { current.free(current.ctx, p, size); }

/* The mapping of /proc/self/maps that holds p: its start and end. */
static int mapping_of(const void *p, uintptr_t *start, uintptr_t *end)
{
	FILE *f = fopen("/proc/self/maps", "r");
	if (f == NULL)
		return -1;
	char line[512];
	int found = -1;
	while (fgets(line, sizeof line, f)) {
		uintptr_t a, b;
		if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR, &a, &b) == 2 && (uintptr_t)p >= a && (uintptr_t)p < b) {
			*start = a;
			*end = b;
			found = 0;
			break;
		}
	}
	fclose(f);
	return found;
}

/* Arenas follow one another from a 2 MiB boundary, in one mapping as long
 * as the range; past it, and of another size, they are CPython's. */
static int one_aligned_range(void)
{
	CHECK(kj_py_arenas(8 * MiB) == 0, "kj_py_arenas");
	char *first = arena(MiB);
	CHECK(first != NULL && (uintptr_t)first % (2 * MiB) == 0, "first arena %p not at a 2 MiB boundary", (void *)first);
	for (int i = 1; i < 8; i++) {
		char *p = arena(MiB);
		CHECK(p == first + i * MiB, "arena %d at %p, not %p", i, (void *)p, (void *)(first + i * MiB));
	}
	CHECK(cpython_allocs == 0, "%d arenas from CPython within the range", cpython_allocs);
	for (int i = 0; i < 8; i++)
		first[i * MiB] = 1; /* committed as used */
	uintptr_t start, end;
	CHECK(mapping_of(first, &start, &end) == 0, "no mapping holds the range");
	CHECK(start <= (uintptr_t)first && end >= (uintptr_t)first + 8 * MiB,
	      "the range is mapped at %" PRIxPTR "-%" PRIxPTR ", not as one mapping of its 8 MiB from %p", start,
	      end, (void *)first);
	char *past = arena(MiB);
	CHECK(past != NULL && (past < first || past >= first + 8 * MiB) && cpython_allocs == 1,
	      "the arena past the range (%p) is not CPython's", (void *)past);
	char *other = arena(256 << 10);
	CHECK(other != NULL && cpython_allocs == 2, "an arena of another size is not CPython's");
	release(past, MiB);
	release(other, 256 << 10);
	CHECK(cpython_frees == 2, "CPython's arenas freed by it: %d", cpython_frees);
	return 0;
}

/* A freed arena's pages go back (it reads as zeros), it is handed out
 * again, and CPython never sees it. */
static int freed_arena_reused_empty(void)
{
	CHECK(kj_py_arenas(4 * MiB) == 0, "kj_py_arenas");
	unsigned char *a = arena(MiB);
	unsigned char *b = arena(MiB);
	CHECK(a != NULL && b == a + MiB, "arenas");
	memset(a, 0xab, MiB);
	release(a, MiB);
	CHECK(cpython_frees == 0, "CPython freed an arena of the range");
	unsigned char *again = arena(MiB);
	CHECK(again == a, "the freed arena was not reused (%p, not %p)", (void *)again, (void *)a);
	for (size_t i = 0; i < MiB; i += 4096)
		CHECK(again[i] == 0, "byte %zu of the reused arena is %#x", i, again[i]);
	return 0;
}

/* An arena CPython mapped before the call goes back to CPython. */
static int earlier_arenas_stay_cpythons(void)
{
	void *before = arena(MiB);
	CHECK(before != NULL && cpython_allocs == 1, "an arena before the call");
	CHECK(kj_py_arenas(4 * MiB) == 0, "kj_py_arenas");
	release(before, MiB);
	CHECK(cpython_frees == 1, "the earlier arena was not freed by CPython");
	return 0;
}

/* One call, of whole 2 MiB: a second, zero or an odd size is refused and
 * changes nothing. */
static int refuses_bad_calls(void)
{
	errno = 0;
	CHECK(kj_py_arenas(0) == -1 && errno == EINVAL, "a zero size");
	errno = 0;
	CHECK(kj_py_arenas(3 * MiB) == -1 && errno == EINVAL, "3 MiB");
	CHECK(current.alloc == cpython_alloc, "a refused call changed the allocator");
	CHECK(kj_py_arenas(2 * MiB) == 0, "kj_py_arenas");
	struct arena_allocator set = current;
	errno = 0;
	CHECK(kj_py_arenas(2 * MiB) == -1 && errno == EINVAL, "a second call");
	CHECK(current.alloc == set.alloc && current.free == set.free, "a second call changed the allocator");
	return 0;
}

int main(void)
{
	int failed = 0;
	failed += run_case("one_aligned_range", one_aligned_range);
	failed += run_case("freed_arena_reused_empty", freed_arena_reused_empty);
	failed += run_case("earlier_arenas_stay_cpythons", earlier_arenas_stay_cpythons);
	failed += run_case("refuses_bad_calls", refuses_bad_calls);
	return failed ? 1 : 0;
}
