/* tree.c — the treap behind every ordered index of the pool (see tree.h).
 * Calls nothing. */
#include "tree.h"

void vpi_tree_init(struct vpi_tree *t, vpi_tcmp cmp, uint32_t seed)
{
	t->root = NULL;
	t->cmp = cmp;
	t->count = 0;
	t->rng = seed ? seed : 0x9e3779b9u;
}

static uint32_t next_prio(struct vpi_tree *t)
{
	uint32_t x = t->rng;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	t->rng = x;
	return x;
}

/* Replace `old` by `repl` in old's parent (or the root). */
static void relink(struct vpi_tree *t, struct vpi_tnode *old,
		   struct vpi_tnode *repl)
{
	struct vpi_tnode *p = old->parent;
	if (repl)
		repl->parent = p;
	if (!p)
		t->root = repl;
	else if (p->left == old)
		p->left = repl;
	else
		p->right = repl;
}

/* Lift n above its parent, keeping in-order sequence. */
static void rotate_up(struct vpi_tree *t, struct vpi_tnode *n)
{
	struct vpi_tnode *p = n->parent;
	relink(t, p, n);
	if (p->left == n) {
		p->left = n->right;
		if (n->right)
			n->right->parent = p;
		n->right = p;
	} else {
		p->right = n->left;
		if (n->left)
			n->left->parent = p;
		n->left = p;
	}
	p->parent = n;
}

/* n takes a fresh priority and rises to its place in the heap order. */
static void lift(struct vpi_tree *t, struct vpi_tnode *n)
{
	n->prio = next_prio(t);
	while (n->parent && n->parent->prio > n->prio)
		rotate_up(t, n);
	t->count++;
}

void vpi_tree_insert(struct vpi_tree *t, struct vpi_tnode *n)
{
	struct vpi_tnode **link = &t->root, *parent = NULL;
	while (*link) {
		parent = *link;
		link = t->cmp(n, parent) < 0 ? &parent->left : &parent->right;
	}
	n->left = n->right = NULL;
	n->parent = parent;
	*link = n;
	lift(t, n);
}

void vpi_tree_insert_after(struct vpi_tree *t, struct vpi_tnode *pos, struct vpi_tnode *n)
{
	/* The in-order slot right after pos: its right child, or else the
	 * left child of the first node of its right subtree. */
	struct vpi_tnode *parent = pos, **link = &pos->right;
	if (*link) {
		parent = pos->right;
		while (parent->left)
			parent = parent->left;
		link = &parent->left;
	}
	n->left = n->right = NULL;
	n->parent = parent;
	*link = n;
	lift(t, n);
}

void vpi_tree_remove(struct vpi_tree *t, struct vpi_tnode *n)
{
	/* Sink n until it has at most one child, lifting the child with the
	 * smaller priority so the heap order holds, then splice it out. */
	while (n->left && n->right)
		rotate_up(t, n->left->prio < n->right->prio ? n->left : n->right);
	relink(t, n, n->left ? n->left : n->right);
	n->left = n->right = n->parent = NULL;
	t->count--;
}

struct vpi_tnode *vpi_tree_first(const struct vpi_tree *t)
{
	struct vpi_tnode *n = t->root;
	while (n && n->left)
		n = n->left;
	return n;
}

struct vpi_tnode *vpi_tree_last(const struct vpi_tree *t)
{
	struct vpi_tnode *n = t->root;
	while (n && n->right)
		n = n->right;
	return n;
}

struct vpi_tnode *vpi_tree_next(const struct vpi_tnode *n)
{
	if (n->right) {
		n = n->right;
		while (n->left)
			n = n->left;
		return (struct vpi_tnode *)n;
	}
	while (n->parent && n->parent->right == n)
		n = n->parent;
	return n->parent;
}

struct vpi_tnode *vpi_tree_prev(const struct vpi_tnode *n)
{
	if (n->left) {
		n = n->left;
		while (n->right)
			n = n->right;
		return (struct vpi_tnode *)n;
	}
	while (n->parent && n->parent->left == n)
		n = n->parent;
	return n->parent;
}

struct vpi_tnode *vpi_tree_ceil(const struct vpi_tree *t,
				  const struct vpi_tnode *probe)
{
	struct vpi_tnode *n = t->root, *best = NULL;
	while (n) {
		if (t->cmp(n, probe) >= 0) {
			best = n;
			n = n->left;
		} else {
			n = n->right;
		}
	}
	return best;
}

struct vpi_tnode *vpi_tree_floor(const struct vpi_tree *t,
				   const struct vpi_tnode *probe)
{
	struct vpi_tnode *n = t->root, *best = NULL;
	while (n) {
		if (t->cmp(n, probe) <= 0) {
			best = n;
			n = n->right;
		} else {
			n = n->left;
		}
	}
	return best;
}

static size_t check_node(const struct vpi_tree *t, const struct vpi_tnode *n,
			 size_t *count)
{
	size_t bad = 0;
	if (!n)
		return 0;
	(*count)++;
	if (n->left) {
		bad += n->left->parent != n;
		bad += n->left->prio < n->prio;
		bad += t->cmp(n->left, n) > 0;
	}
	if (n->right) {
		bad += n->right->parent != n;
		bad += n->right->prio < n->prio;
		bad += t->cmp(n->right, n) < 0;
	}
	return bad + check_node(t, n->left, count) + check_node(t, n->right, count);
}

size_t vpi_tree_check(const struct vpi_tree *t)
{
	size_t count = 0, bad = 0;
	const struct vpi_tnode *prev = NULL;
	if (t->root && t->root->parent)
		bad++;
	bad += check_node(t, t->root, &count);
	bad += count != t->count;
	/* In-order walk through next() must be sorted: catches broken links
	 * that the local checks above cannot see. */
	for (const struct vpi_tnode *n = vpi_tree_first(t); n; n = vpi_tree_next(n)) {
		if (prev && t->cmp(prev, n) > 0)
			bad++;
		prev = n;
	}
	return bad;
}
