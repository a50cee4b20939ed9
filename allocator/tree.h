/* tree.h — an intrusive ordered tree (a treap with parent links).
 *
 * The pool keeps every index in one of these: regions by address, free
 * regions and holes by (size, address). Operations are O(log n) expected;
 * next/prev walk parent links, O(1) amortized over an in-order walk.
 * Nodes are embedded in the caller's structs; the tree allocates nothing.
 */
#ifndef VPMM_TREE_H
#define VPMM_TREE_H

#include <stddef.h>
#include <stdint.h>

struct vpi_tnode {
	struct vpi_tnode *left, *right, *parent;
	uint32_t prio; /* heap order: a parent's prio is <= its children's */
};

/* <0, 0, >0 like strcmp; must be a total order over the nodes in the tree. */
typedef int (*vpi_tcmp)(const struct vpi_tnode *a, const struct vpi_tnode *b);

struct vpi_tree {
	struct vpi_tnode *root;
	vpi_tcmp cmp;
	size_t count;
	uint32_t rng; /* xorshift state for priorities */
};

void vpi_tree_init(struct vpi_tree *t, vpi_tcmp cmp, uint32_t seed);
void vpi_tree_insert(struct vpi_tree *t, struct vpi_tnode *n);
/* n, which must sort right after pos (already in t), without comparing:
 * the same tree as vpi_tree_insert makes. */
void vpi_tree_insert_after(struct vpi_tree *t, struct vpi_tnode *pos, struct vpi_tnode *n);
void vpi_tree_remove(struct vpi_tree *t, struct vpi_tnode *n);
struct vpi_tnode *vpi_tree_first(const struct vpi_tree *t);
struct vpi_tnode *vpi_tree_last(const struct vpi_tree *t);
struct vpi_tnode *vpi_tree_next(const struct vpi_tnode *n);
struct vpi_tnode *vpi_tree_prev(const struct vpi_tnode *n);
/* First node >= probe / last node <= probe (probe need not be in the tree). */
struct vpi_tnode *vpi_tree_ceil(const struct vpi_tree *t,
				  const struct vpi_tnode *probe);
struct vpi_tnode *vpi_tree_floor(const struct vpi_tree *t,
				   const struct vpi_tnode *probe);
/* Structural check: order, heap property, parent links, count. Returns the
 * number of violations found. */
size_t vpi_tree_check(const struct vpi_tree *t);

#define vpi_container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))

#endif
