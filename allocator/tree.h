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

struct vpmm_tnode {
	struct vpmm_tnode *left, *right, *parent;
	uint32_t prio; /* heap order: a parent's prio is <= its children's */
};

/* <0, 0, >0 like strcmp; must be a total order over the nodes in the tree. */
typedef int (*vpmm_tcmp)(const struct vpmm_tnode *a, const struct vpmm_tnode *b);

struct vpmm_tree {
	struct vpmm_tnode *root;
	vpmm_tcmp cmp;
	size_t count;
	uint32_t rng; /* xorshift state for priorities */
};

void vpmm_tree_init(struct vpmm_tree *t, vpmm_tcmp cmp, uint32_t seed);
void vpmm_tree_insert(struct vpmm_tree *t, struct vpmm_tnode *n);
void vpmm_tree_remove(struct vpmm_tree *t, struct vpmm_tnode *n);
struct vpmm_tnode *vpmm_tree_first(const struct vpmm_tree *t);
struct vpmm_tnode *vpmm_tree_last(const struct vpmm_tree *t);
struct vpmm_tnode *vpmm_tree_next(const struct vpmm_tnode *n);
struct vpmm_tnode *vpmm_tree_prev(const struct vpmm_tnode *n);
/* First node >= probe / last node <= probe (probe need not be in the tree). */
struct vpmm_tnode *vpmm_tree_ceil(const struct vpmm_tree *t,
				  const struct vpmm_tnode *probe);
struct vpmm_tnode *vpmm_tree_floor(const struct vpmm_tree *t,
				   const struct vpmm_tnode *probe);
/* Structural check: order, heap property, parent links, count. Returns the
 * number of violations found. */
size_t vpmm_tree_check(const struct vpmm_tree *t);

#define vpmm_container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))

#endif
