/* rmm-time.c — the Time column of an RMM allocation log (rmm-time.h).
 * Calls nothing. */
#include "rmm-time.h"

bool rmm_parse_time(const char *s, uint64_t *out)
{
	uint64_t part[3] = { 0 }, frac = 0;
	for (int i = 0; i < 3; i++) {
		int n = 0;
		while (*s >= '0' && *s <= '9' && n < 2) {
			part[i] = part[i] * 10 + (uint64_t)(*s++ - '0');
			n++;
		}
		if (!n || (i > 0 && n != 2) || (i < 2 && *s++ != ':'))
			return false;
	}
	if (part[0] > 23 || part[1] > 59 || part[2] > 60)
		return false;
	if (*s == '.' || *s == ':') {
		int n = 0;
		s++;
		while (*s >= '0' && *s <= '9' && n < 9) {
			frac = frac * 10 + (uint64_t)(*s++ - '0');
			n++;
		}
		if (!n)
			return false;
		/* to microseconds: n digits are frac / 10^n seconds */
		while (n > 6) {
			frac /= 10;
			n--;
		}
		while (n < 6) {
			frac *= 10;
			n++;
		}
	}
	if (*s)
		return false;
	*out = ((part[0] * 60 + part[1]) * 60 + part[2]) * 1000000 + frac;
	return true;
}
