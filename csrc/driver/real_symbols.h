// Finds libc's own dlsym/dlvsym. vmmipc exports dlsym and dlvsym itself, so a
// call "by name" inside the library would land back in the hook; these are the
// only ways the library reaches the real ones.
#pragma once

namespace vmmipc::driver {

// libc's dlsym (newest version first). Never null after the first call on
// glibc >= 2.2.5; safe to call from any thread, never at load time.
using DlsymFn = void* (*)(void*, const char*);
using DlvsymFn = void* (*)(void*, const char*, const char*);
DlsymFn RealDlsym();
DlvsymFn RealDlvsym();

}  // namespace vmmipc::driver
