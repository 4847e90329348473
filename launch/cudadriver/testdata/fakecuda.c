/* A stand-in for the NVIDIA driver's libcuda.so.1, for tests: cuInit returns
   $FAKE_CUDA_INIT (default 0), cuDeviceGetCount reports $FAKE_CUDA_DEVICES
   devices (default 1). Build: gcc -shared -fPIC -Wl,-soname,libcuda.so.1 */
#include <stdlib.h>

static int env(const char *name, int def) {
	const char *s = getenv(name);
	return s && *s ? atoi(s) : def;
}

int cuInit(unsigned int flags) { (void)flags; return env("FAKE_CUDA_INIT", 0); }

int cuDeviceGetCount(int *n) {
	*n = env("FAKE_CUDA_DEVICES", 1);
	return 0;
}

int cuGetErrorName(int code, const char **s) {
	switch (code) {
	case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
	case 999: *s = "CUDA_ERROR_UNKNOWN"; return 0;
	}
	return 1;
}
