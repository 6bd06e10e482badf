{
  "targets": [
    {
      "target_name": "wavebus_native",
      "sources": [
        "native/addon.cc",
        "native/coded_error.cc",
        "native/copy_worker.cc",
        "native/crc32c.cc",
        "native/crc_pair.cc",
        "native/cuda_backend.cc",
        "native/cuda_region.cc",
        "native/detector_pass.cc",
        "native/file_writer.cc",
        "native/host_memory.cc",
        "native/mailbox.cc",
        "native/mailbox_reader.cc",
        "native/mailbox_writer.cc",
        "native/malloc_tuning.cc",
        "native/mapped_file.cc",
        "native/shm_segment.cc"
      ],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS", "NODE_API_SWALLOW_UNTHROWABLE_EXCEPTIONS"],
      "cflags_cc": ["-std=c++17", "-O2", "-fexceptions", "-Wall", "-Wextra", "-Wno-unused-parameter"],
      "cflags_cc!": ["-fno-exceptions", "-fno-rtti"],
      "cflags!": ["-fno-exceptions"],
      "libraries": ["-ldl", "-lrt"]
    }
  ]
}
