        if (vec_ok && e + 8 <= n) {
            uint4 w;
            w.x = f2h(v[0]) | ((unsigned)f2h(v[1]) << 16); w.y = f2h(v[2]) | ((unsigned)f2h(v[3]) << 16);
            w.z = f2h(v[4]) | ((unsigned)f2h(v[5]) << 16); w.w = f2h(v[6]) | ((unsigned)f2h(v[7]) << 16);
            *(uint4*)(out + e) = w;
        } else {
            for (int i = 0; i < 8 && e + i < n; i++) out[e + i] = f2h(v[i]);
        }
